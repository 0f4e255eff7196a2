"""The models listing's windows, as values: what is added, what is never touched."""

from __future__ import annotations

import orjson

from proxy.core.models import ResolvedModel
from proxy.routes.models_list import MAX_MODELS, with_windows


def resolve(name: str) -> ResolvedModel:
    source = "default" if name.startswith("unknown") else "registry"
    return ResolvedModel(name, 100_000, 8_000, "o200k_base", "x", source=source)  # type: ignore[arg-type]


def test_only_known_models_in_a_listing_get_figures() -> None:
    body = orjson.dumps({"data": [{"id": "a"}, {"id": "unknown-b"}, "junk", {"id": 7}]})
    out = orjson.loads(with_windows(body, resolve) or b"")
    assert out["data"][0] == {
        "id": "a",
        "context_window": 100_000,
        "max_input_tokens": 100_000,
        "max_tokens": 8_000,
    }
    assert out["data"][1:] == [{"id": "unknown-b"}, "junk", {"id": 7}]


def test_nothing_to_add_relays_the_body_as_it_came() -> None:
    assert with_windows(b"not json", resolve) is None
    assert with_windows(b"[1, 2]", resolve) is None
    assert with_windows(orjson.dumps({"data": [{"id": "unknown"}]}), resolve) is None
    given = {"id": "a", "context_window": 1, "max_input_tokens": 2, "max_tokens": 3}
    assert with_windows(orjson.dumps({"data": [given]}), resolve) is None
    assert with_windows(orjson.dumps({"data": [{"id": "x" * 10_000}]}), resolve) is None


def test_a_hostile_listing_is_read_only_so_far() -> None:
    asked: list[str] = []

    def counting(name: str) -> ResolvedModel:
        asked.append(name)
        return resolve(name)

    body = orjson.dumps({"data": [{"id": f"m{i}"} for i in range(MAX_MODELS + 500)]})
    out = orjson.loads(with_windows(body, counting) or b"")
    assert len(asked) == MAX_MODELS
    assert "context_window" not in out["data"][-1]
    single = orjson.loads(with_windows(b'{"id": "one"}', resolve) or b"")  # one model
    assert single["max_tokens"] == 8_000
