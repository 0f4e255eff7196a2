"""Which values a bounded list keeps first: settings and labelled facts before log fields.

Three lists keep at most so many values (values.py finds them): the identifiers
restored after a summary (identifiers.py), a trimmed view's digest of what it left
out and an elided tool output's placeholder (omitted.py). Kept newest first and
nothing else, a tool's build logs (``pid=8196``, ``key=session:6443``, twenty of
each) crowded out the ten settings a config read had returned a few turns before,
and the model then invented every one of them (issue 21: Qwen2.5-Coder-1.5B agent
bench, 0/10 recalled). So values are kept by tier, newest first within a tier:

0. settings and labelled facts: ``SERVER_PORT = 7781``, ``PORT=8080``,
   ``db.port: 5432``, ``port: 8443``, ``owner: Dana Whitfield``;
1. the rest: a bare lower-case ``key=value`` (``color=teal``), ids, paths, URLs,
   error codes and quoted errors;
2. fields a log repeats: a name or a label seen with ``LOG_FIELD_VALUES`` or more
   values in what is ranked (``pid=…``; ``build: 10``, ``build: 11``, … when every
   request names a build); its newest value stays in its own tier.

Below all of these (``heard``): values only the assistant's own turns hold. A value
the user or a tool stated is a fact the conversation was given; one only the
assistant wrote is its own bookkeeping (an id it tags each acknowledgement with) or
a guess. Kept newest first alone, an assistant's acknowledgement ids filled a
trimmed view's digest and crowded out the facts the user had stated.

Pure: values in, an order out.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # for annotations: ranks what values.py found
    from proxy.core.values import Value

# A name given this many different values in one span is a log's field, not a setting.
LOG_FIELD_VALUES = 3
# The role whose turns state no fact by themselves: the model's own.
ASSISTANT = "assistant"
_UNHEARD = 3  # added to a value's tier when only the assistant's turns hold it
_SETTING_KINDS = frozenset({"kv", "spaced", "assign", "colon"})
_LABELLED_KINDS = frozenset({"spaced", "assign", "colon", "labelled", "named"})
# A setting's name: constant case (PORT, SERVER_PORT), dotted or snake case (db.port).
_SETTING_NAME = re.compile(r"[A-Z][A-Z0-9_]+|[A-Za-z][\w-]*(?:[._][\w-]+)+")


def name_of(value: Value) -> str | None:
    """What a setting or a labelled value is the value of (``SERVER_PORT``, ``build``);
    None for other kinds."""
    if value.kind in _SETTING_KINDS:
        return value.key.split("=", 1)[0]
    if value.kind in _LABELLED_KINDS:
        return "label:" + value.shown.split(": ", 1)[0]
    return None


def base_tier(value: Value) -> int:
    """0 for a setting or a labelled fact, 1 for any other value."""
    if value.kind in _LABELLED_KINDS:
        return 0
    name = name_of(value)
    return 0 if name is not None and _SETTING_NAME.fullmatch(name) else 1


def tiers(values: Sequence[Value]) -> list[int]:
    """Each value's tier, ``values`` being what one list ranks, oldest first."""
    names = [name_of(value) for value in values]
    counts = Counter(name for name in names if name is not None)
    newest: dict[str, int] = {name: i for i, name in enumerate(names) if name is not None}
    out = []
    for i, (value, name) in enumerate(zip(values, names, strict=True)):
        repeated = name is not None and counts[name] >= LOG_FIELD_VALUES and newest[name] != i
        out.append(2 if repeated else base_tier(value))
    return out


def heard(ranks: Sequence[int], stated: Sequence[bool]) -> list[int]:
    """``ranks`` with every value no user, tool or previous summary ``stated`` (only
    assistant turns hold it) ranked after all the others."""
    return [rank if said else rank + _UNHEARD for rank, said in zip(ranks, stated, strict=True)]


def keep_order(ranks: Sequence[int], *, newest_first: bool = True) -> list[int]:
    """The indices of items ranked ``ranks`` (oldest first) in the order a bounded list
    keeps them: lowest tier first, newest (or, if not ``newest_first``, first read)
    first within a tier."""
    sign = -1 if newest_first else 1
    return sorted(range(len(ranks)), key=lambda i: (ranks[i], sign * i))
