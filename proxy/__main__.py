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

log = logging.getLogger("proxy")


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


def _warn_deprecated(settings: Settings) -> None:
    """Once per start: ``enabled``, the older switch beside ``mode``, and the flat keys
    now in groups (``precompact_ratio``: ``precompact.ratio``), still read for one release:
    what to set instead."""
    from proxy.config.compaction import RENAMED

    if "enabled" in settings.compaction.model_fields_set:
        log.warning(
            "compaction.enabled is deprecated and goes in a later release: set "
            "compaction.mode (on, shadow or off) instead"
        )
    for key in settings.compaction._renamed:
        group, name = RENAMED[key]
        log.warning(
            "compaction.%s is deprecated and goes in a later release: set compaction.%s.%s",
            key,
            group,
            name,
        )
    if any(entry.enabled is not None for entry in settings.tenants):
        log.warning(
            "tenants: an entry's enabled is deprecated and goes in a later release: set "
            "its mode (on, shadow or off) instead"
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
    from proxy.serve.check_config import TENANT_KEYS

    print(f"compaction-proxy: keyed by {TENANT_KEYS[source]}", file=sys.stderr)
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
    check.add_argument(
        "--ask-upstream",
        action="store_true",
        help="ask the upstream what it says of each --model (/v1/models, /props) first",
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
            contact, names, ask = not args.no_store, args.model, args.ask_upstream
            from proxy.serve.check_config import check_config

            return check_config(settings, contact=contact, write=args.store, names=names, ask=ask)
        server = {k: v for k, v in (("host", args.host), ("port", args.port)) if v is not None}
        if server:
            settings = settings.model_copy(
                update={"server": settings.server.model_copy(update=server)}
            )
        _setup_logging(settings.logging)
        _warn_unencrypted(settings)
        _warn_tenant_key(settings)
        _warn_deprecated(settings)
        from proxy.serve import serve as serve_proxy

        return serve_proxy(settings)
    except ConfigError as exc:
        print(f"compaction-proxy: {exc.message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
