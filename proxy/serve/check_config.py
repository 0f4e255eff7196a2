"""``compaction-proxy check-config``: the config as it resolves, each model as a request
for it resolves and where its figures come from, and what the store it names says."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from proxy.redact import redact_url

if TYPE_CHECKING:
    from proxy.config import Settings
    from proxy.core.encodings import Encoder
    from proxy.core.models import ModelTable
    from proxy.store.check import StoreReport

# Where tenant ids' key comes from (core/tenant_ids.tenant_key's source), as said.
TENANT_KEYS = {
    "secret": "server.tenant_id_secret",
    "upstream_key": "a key derived from upstream.api_key (no server.tenant_id_secret)",
    "legacy": "the legacy key (neither server.tenant_id_secret nor upstream.api_key is set)",
}


def check_config(
    settings: Settings,
    *,
    contact: bool = True,
    write: bool = False,
    names: Sequence[str] = (),
    ask: bool = False,
) -> int:
    """``check-config``: the config as it resolves (and each model of ``names``, with where
    its figures come from; ``ask``: the upstream asked about them first); 1 when the store
    it names cannot be used (``contact``: reached, its credentials accepted; ``write``:
    written to as well), so a deploy step or a post-install check fails on the store as on
    a bad key."""
    import asyncio

    from proxy.services import load_models

    # The model table and tokenizers, built as the server's lifespan builds them.
    table, encoders = asyncio.run(load_models(settings))
    url = redact_url(settings.store.url)
    remote = not settings.store.url.startswith("memory://")
    report = None
    if remote and contact:
        from proxy.store.check import inspect_store

        report = asyncio.run(inspect_store(settings.store, write))
    print(f"upstream: {redact_url(settings.upstream.base_url)}")
    print(f"store:    {url}")
    c = settings.compaction
    print(
        f"compaction: {c.effective_mode}, trigger {c.trigger_ratio:.0%}, "
        f"target {c.target_ratio:.0%}"
    )
    _print_tenants(settings)
    from proxy.core.tenant_ids import tenant_key

    print(f"tenant ids: keyed by {TENANT_KEYS[tenant_key(settings)[1]]}")
    _print_models(settings, table, encoders, names, ask)
    if not remote:
        print("learned windows: kept in each serving process (see /metrics)")
        if write:
            print(f"store check: {url} is in-process, nothing to reach")
        return 0
    if report is None:
        print("store check: not contacted (--no-store)")
        return 0
    return _print_store_check(url, report, write)


def _print_models(
    settings: Settings,
    table: ModelTable,
    encoders: dict[str, Encoder],
    names: Sequence[str],
    ask: bool,
) -> None:
    """The model registry, each ``models:`` rule and the default as they resolve, then each
    model of ``names`` as a request for it resolves (before learned windows)."""
    print(f"model registry: {table.registry.release} ({len(table.registry)} model names)")
    print(f"{'match':<28} {'window':>9} {'max out':>8}  tokenizer")
    rules = [(s.match, s.context_window, s.max_output_tokens) for s in settings.models]
    rules.append(("(default)", settings.default_model.context_window, 0))
    for match, window, max_out in rules:
        resolved = table.resolve(match) if match != "(default)" else table.resolve("")
        enc = encoders[resolved.tokenizer]
        quality = "exact" if enc.exact else "approximate"
        max_out = max_out or resolved.max_output_tokens
        print(f"{match:<28} {window:>9} {max_out:>8}  {resolved.tokenizer} ({quality})")
    named = [table.resolve(name) for name in names]
    if ask and named:  # --ask-upstream: what its listing says, as a request would use it
        import asyncio

        from proxy.upstream.discovery import described_now

        named = asyncio.run(described_now(settings, named))
    for name, m in zip(names, named, strict=True):  # --model: as a request resolves it
        slots = "" if m.slots is None else f", {m.slots} slot{'s' if m.slots > 1 else ''}"
        print(f"{name:<28} {m.context_window:>9} {m.max_output_tokens:>8}  from {m.source}{slots}")


def _print_store_check(url: str, report: StoreReport, write: bool) -> int:
    """What a shared store said when contacted: its learned windows, then 1 if it cannot
    be used (the exit status of ``check-config``), else 0."""
    if report.windows is not None:
        _print_learned_windows(report.windows)
    elif report.windows_problem is not None:
        print(f"learned windows: not read ({report.windows_problem})")
    if report.problem is not None:
        print(f"store check: {url} {report.problem}", file=sys.stderr)
        return 1
    print(f"store check: {url} answers PING{' and takes writes' if write else ''}")
    return 0


def _print_tenants(settings: Settings) -> None:
    """Each ``tenants:`` entry as it resolves (README "Per-tenant policy")."""
    from proxy.tenants import PolicyTable

    print(f"tenants: {len(settings.tenants) or 'none'}")
    table = PolicyTable.build(settings.tenants, settings.compaction)
    for entry in settings.tenants:
        policy = table.policy_for(entry.id or entry.ids[0])
        assert policy is not None
        c, ids = policy.compaction, 1 if entry.id else len(entry.ids)
        hourly, daily = policy.summaries_per_hour, policy.summarizer_tokens_per_day
        caps = [f"{hourly} summaries/h"] * (hourly is not None)
        caps += [f"{daily} summarizer tokens/day"] * (daily is not None)
        print(
            f"  {entry.name}: {ids} id(s), {c.effective_mode}, trigger {c.trigger_ratio:.0%}, "
            f"target {c.target_ratio:.0%}, caps: {', '.join(caps) or 'none'}"
        )


def _print_learned_windows(learned: dict[str, int]) -> None:
    """The windows learned from overflow errors, then the output limits learned from
    output-budget errors (a shared store's; memory://'s live in each serving process)."""
    from proxy.upstream.ceilings import LearnedCeilings
    from proxy.upstream.windows import LearnedWindows

    for kind, what in ((LearnedWindows, "windows"), (LearnedCeilings, "output limits")):
        _print_learned(learned, kind.PREFIX, what, always=kind is LearnedWindows)


def _print_learned(learned: dict[str, int], prefix: str, what: str, *, always: bool) -> None:
    from proxy.upstream.windows import parse_window_key

    # Only values: a shared value's "lowered recently" marker is bookkeeping, and keys
    # of the old layout are no longer read (they expire).
    parsed = {parse_window_key(k, prefix): v for k, v in learned.items()}
    windows = [(k, v) for k, v in parsed.items() if k is not None]
    windows.sort(key=lambda item: (item[0][0], item[0][1], item[0][2] or ""))
    if windows or always:
        print(f"learned {what}: {len(windows) or 'none'}")
    for (upstream, model, tenant), tokens in windows:
        scope = "one tenant, " if tenant else ""
        name = model if model.isprintable() else repr(model)  # the client's text
        print(f"  {name:<26} {tokens:>9}  ({scope}from {redact_url(upstream)})")
