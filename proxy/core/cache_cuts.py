"""Cache-aware cuts (``compaction.cache_aware``): a cut's cost is the cache it invalidates.

An upstream with a prompt cache (OpenAI's, DeepSeek's, llama.cpp's slot) bills the
prefix it has seen at a fraction of the input price. Between two moves of the cut the
served view only grows at its end (invariant 5), so every turn's prefix is cached; the
turn after a move pays for the whole view again. A background pre-compaction
(precompact.py) moves the cut at ``precompact.ratio`` of the window, before the
trigger asks for it: with the upstream caching, the view served is *held* while it
fits under the trigger, and the pre-compacted snapshot is applied only when the held
view would cross it. So that it then lands at ``target_ratio`` (the next move as many
turns away as an inline compaction's), the background run folds in deeper: down to
``landing_ratio`` of the window, what the history grows by between the two ratios
taken off the target. The turn that crosses the trigger still finds its summary ready.

Holding is worth only the cache it keeps: a session idle past its provider's TTL has
lost that cache already, so its next turn pays for the whole prefix whatever it sends,
and a snapshot waiting then is applied on that turn (``expired``), not later over a warm
cache. The turn after an idle is where the cut moves.

Pure arithmetic: the caller says whether the upstream caches this session's prompts
(the ledger's cached tokens, observe/ledger.py), whether its last prompt is cached still
(sent within its TTL, observe/cache_ledger.py) and what the held view costs now.
"""

from __future__ import annotations

from typing import Literal, get_args

from proxy.core.budget import Budget

# What became of a snapshot newer than the view served last (a cache-aware turn's plan):
# ``held``, it waits (the view served last fits under the trigger and is cached still);
# applied because the session's cache ``expired`` (idle past its TTL), the held view
# would cross the ``trigger``, the upstream reported no caching (``uncached``), or the
# history no longer starts with what the held view covered (``changed``: a rewind, an
# edit). A closed set: a metric label, the X-Compaction-Cache-Plan header.
CachePlan = Literal["held", "expired", "trigger", "uncached", "changed"]
CACHE_PLANS: tuple[CachePlan, ...] = get_args(CachePlan)


def holds(held_tokens: int | None, budget: Budget) -> bool:
    """Whether the view served last (``held_tokens``: its total now, reserve included;
    None: there is none, or this history no longer starts with what it covers) is served
    again instead of a newer snapshot: while it fits under the trigger."""
    return held_tokens is not None and held_tokens <= budget.trigger


def landing_ratio(trigger: float, target: float, precompact: float) -> float:
    """The share of the window a background compaction started at ``precompact`` leaves
    when its snapshot is held until the trigger: ``target`` less the growth from
    ``precompact`` to ``trigger`` (0.5 - (0.8 - 0.6) = 0.3 with the defaults); never
    below half the target scaled as without holding (``target * precompact / trigger``):
    a low ``precompact`` then lands above the target rather than fold in everything."""
    scaled = target * precompact / trigger
    return max(target - (trigger - precompact), scaled / 2)


def cache_plan(held_tokens: int | None, budget: Budget, *, caches: bool, warm: bool) -> CachePlan:
    """Whether a newer snapshot waits (``held``) or is applied now, and why: the view
    served last (``held_tokens`` as for ``holds``) is held while it fits under the
    trigger, the upstream ``caches`` the session's prompts and the last one is ``warm``
    (cached still)."""
    if held_tokens is None:
        return "changed"
    if not holds(held_tokens, budget):
        return "trigger"
    if not caches:
        return "uncached"
    return "held" if warm else "expired"
