"""Command line: ``compaction-proxy serve | check-config | tenant-id | simulate-upstream``."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from collections.abc import Sequence
from types import FrameType
from typing import TYPE_CHECKING

from proxy.redact import redact_url

if TYPE_CHECKING:  # imported once SIGTERM is handled (main): pydantic, orjson take a while
    from proxy.config import LoggingSettings, Settings
    from proxy.core.encodings import Encoder
    from proxy.core.models import ModelTable
    from proxy.store.check import StoreReport

log = logging.getLogger("proxy")


def _check_config(
    settings: Settings, *, contact: bool = True, write: bool = False, names: Sequence[str] = ()
) -> int:
    """``check-config``: the config as it resolves (and each model of ``names``, with where
    its figures come from); 1 when the store it names cannot be used (``contact``: reached,
    its credentials accepted; ``write``: written to as well), so a deploy step or a
    post-install check fails on the store as on a bad key."""
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

    print(f"tenant ids: keyed by {_TENANT_KEYS[tenant_key(settings)[1]]}")
    _print_models(settings, table, encoders, names)
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
    settings: Settings, table: ModelTable, encoders: dict[str, Encoder], names: Sequence[str]
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
    for name in names:  # --model
        m = table.resolve(name)
        print(f"{name:<28} {m.context_window:>9} {m.max_output_tokens:>8}  from {m.source}")


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


def _setup_logging(settings: LoggingSettings) -> None:
    """JSON lines or text for the ``proxy`` loggers (``logging`` in the config)."""
    from proxy.observe.logs import configure_logging

    configure_logging(settings)


def _exit_on_sigterm() -> None:
    """SIGTERM ends the process from the first instant, until the server installs its own
    handler (proxy.serve.shutdown). As PID 1 (a container's entry point) a signal with no
    handler is ignored: without this one, a SIGTERM during start-up (imports, tokenizers)
    would be lost, and the orchestrator would wait out its grace period to SIGKILL."""

    def stop(sig: int, frame: FrameType | None) -> None:
        raise SystemExit(128 + sig)

    signal.signal(signal.SIGTERM, stop)


def _warn_unencrypted(settings: Settings) -> None:
    """Once per start: snapshots (summaries of user content) leave the process in plaintext."""
    store = settings.store
    if not store.url.startswith("memory://") and not store.encryption_keys:
        log.warning(
            "store %s has no store.encryption_keys: summaries of user content are stored "
            "there in plaintext (set encryption_keys, and store.require_encryption to refuse "
            "plaintext)",
            redact_url(store.url),
        )


_TENANT_KEYS = {
    "secret": "server.tenant_id_secret",
    "upstream_key": "a key derived from upstream.api_key (no server.tenant_id_secret)",
    "legacy": "the legacy key (neither server.tenant_id_secret nor upstream.api_key is set)",
}


def _warn_tenant_key(settings: Settings) -> None:
    """Once per start: tenant ids anyone can compute, or that move with the upstream key."""
    from proxy.core.tenant_ids import tenant_key

    _, source = tenant_key(settings)
    if source == "upstream_key":
        log.warning(
            "server.tenant_id_secret is not set: tenant ids are keyed by upstream.api_key "
            "and change when it does (sessions start over, tenants: entries no longer "
            "match); set a secret of their own"
        )
    elif source == "legacy":
        log.warning(
            "server.tenant_id_secret is not set: tenant ids are the legacy ones, which "
            "anyone can compute from a key (in logs, /admin, tenants:); set it"
        )


def _tenant_id(settings: Settings) -> int:
    """The id ``GET /admin/tenants`` shows for the key on stdin (kept out of argv: a
    command line is visible to every user of the machine, and kept in shell history),
    under the deployment's key, as ``settings`` (its config file, the environment) say."""
    from proxy.core.tenant_ids import TenantIds, tenant_key
    from proxy.tenants import SHOWN

    key = sys.stdin.readline().strip()
    if not key:
        print("compaction-proxy: no API key on stdin", file=sys.stderr)
        return 2
    secret, source = tenant_key(settings)
    print(TenantIds(secret).of({"authorization": f"Bearer {key}"})[:SHOWN])
    print(f"compaction-proxy: keyed by {_TENANT_KEYS[source]}", file=sys.stderr)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="compaction-proxy", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the proxy")
    serve.add_argument("--config", help="YAML config file (default: built-in defaults)")
    serve.add_argument("--host", help="listen address (overrides server.host)")
    serve.add_argument("--port", type=int, help="listen port (overrides server.port)")
    check = sub.add_parser("check-config", help="validate a config and print the model table")
    check.add_argument("config", help="YAML config file")
    check.add_argument(
        "--model", action="append", default=[], help="also resolve this model name (repeatable)"
    )
    reach = check.add_mutually_exclusive_group()
    reach.add_argument(
        "--store", action="store_true", help="write to the store too (exit 1 if it refuses)"
    )
    reach.add_argument(
        "--no-store",
        action="store_true",
        help="do not contact the store (by default: exit 1 if it cannot be reached or "
        "refuses the credentials)",
    )
    tenant = sub.add_parser(
        "tenant-id", help="print the tenant id (for `tenants:`) of the API key read from stdin"
    )
    tenant.add_argument(
        "--config", help="YAML config file (its server.tenant_id_secret; the environment's too)"
    )
    sim = sub.add_parser("simulate-upstream", help="run the local OpenAI-compatible simulator")
    sim.add_argument("--config", help="simulator YAML config")
    sim.add_argument("--host", default="127.0.0.1")
    sim.add_argument("--port", type=int, default=8081)
    args = parser.parse_args(argv)
    if args.command == "serve":
        _exit_on_sigterm()
    from proxy.config import LoggingSettings, load_settings
    from proxy.errors import ConfigError

    try:
        if args.command == "simulate-upstream":
            _setup_logging(LoggingSettings(format="text"))
            from proxy.simulator import load_simulator_config, serve_simulator

            serve_simulator(load_simulator_config(args.config), args.host, args.port)
            return 0
        settings = load_settings(getattr(args, "config", None))
        if args.command == "tenant-id":
            return _tenant_id(settings)
        if args.command == "check-config":
            _setup_logging(LoggingSettings(format="text", level="warning"))
            contact, names = not args.no_store, args.model
            return _check_config(settings, contact=contact, write=args.store, names=names)
        server = {k: v for k, v in (("host", args.host), ("port", args.port)) if v is not None}
        if server:
            settings = settings.model_copy(
                update={"server": settings.server.model_copy(update=server)}
            )
        _setup_logging(settings.logging)
        _warn_unencrypted(settings)
        _warn_tenant_key(settings)
        from proxy.serve.server import serve as serve_proxy

        return serve_proxy(settings)
    except ConfigError as exc:
        print(f"compaction-proxy: {exc.message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
