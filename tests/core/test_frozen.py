"""``quick_init``: the same values as the dataclass's own ``__init__`` builds, still frozen."""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass
from typing import Any

import pytest

from proxy.core.frozen import quick_init
from proxy.core.models import ResolvedModel
from proxy.core.outcome import Outcome, Turn
from proxy.routes.chat import CHAT
from proxy.upstream.api import Attempt, Route


@dataclass(frozen=True, slots=True)
class _Own:
    a: int
    b: str
    c: list[int] | None = None
    d: int = 7


_Quick = quick_init(
    dataclass(frozen=True, slots=True)(
        type(
            "_Quick",
            (),
            {
                "__annotations__": {"a": "int", "b": "str", "c": "list[int] | None", "d": "int"},
                "c": None,
                "d": 7,
            },
        )
    )
)


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        ((1, "x"), {}),
        ((1, "x", [2]), {}),
        ((1,), {"b": "y", "d": 9}),
        ((), {"d": 0, "a": 2, "b": ""}),
    ],
)
def test_the_same_fields_as_the_dataclasses_own_init(
    args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    ours, theirs = _Quick(*args, **kwargs), _Own(*args, **kwargs)
    assert dataclasses.astuple(ours) == dataclasses.astuple(theirs)
    assert repr(ours).replace("_Quick", "_Own") == repr(theirs)
    assert ours == _Quick(*args, **kwargs)


def test_the_same_errors_for_wrong_arguments() -> None:
    for args, kwargs in [
        ((), {}),
        ((1, "x", None, 2, 3), {}),
        ((1, "x"), {"e": 1}),
        ((1,), {"a": 1}),
    ]:
        with pytest.raises(TypeError) as ours:
            _Quick(*args, **kwargs)
        with pytest.raises(TypeError) as theirs:
            _Own(*args, **kwargs)
        assert str(ours.value).split("() ", 1)[1] == str(theirs.value).split("() ", 1)[1]


def test_still_frozen_and_replaceable() -> None:
    value = _Quick(1, "x")
    with pytest.raises(dataclasses.FrozenInstanceError):
        value.a = 2  # type: ignore[misc]
    assert dataclasses.replace(value, d=3) == _Quick(1, "x", None, 3)


def _parameters(cls: type) -> list[tuple[str, Any, Any]]:
    return [(p.name, p.kind, p.default) for p in inspect.signature(cls).parameters.values()]


@pytest.mark.parametrize("cls", [Turn, Outcome, Route, Attempt])
def test_the_pipelines_values_keep_their_signature_and_fields(cls: type) -> None:
    own = dataclass(frozen=True, slots=True)(
        type(
            cls.__name__,
            (),
            {
                "__annotations__": dict(cls.__annotations__),
                **{
                    f.name: f.default
                    for f in dataclasses.fields(cls)
                    if f.default is not dataclasses.MISSING
                },
            },
        )
    )
    assert _parameters(cls) == _parameters(own)
    model = ResolvedModel("m", 1000, 100, "cl100k_base", "default")
    samples = {Turn: ({}, b"{}", model, "t", None, []), Outcome: ("passthrough", None, 0, 1, 2)}
    samples |= {Route: (CHAT, "u", [], b"{}", {}), Attempt: (b"{}", Outcome.passthrough(b"", 1))}
    built, reference = cls(*samples[cls]), own(*samples[cls])
    assert dataclasses.astuple(built) == dataclasses.astuple(reference)


def test_refuses_what_it_cannot_build_the_same() -> None:
    @dataclass(frozen=True)
    class Unslotted:
        a: int

    @dataclass(frozen=True, slots=True)
    class Factory:
        a: list[int] = dataclasses.field(default_factory=list)

    @dataclass(frozen=True, slots=True)
    class Posted:
        a: int

        def __post_init__(self) -> None:
            pass

    for cls in (Unslotted, Factory, Posted):
        with pytest.raises(TypeError):
            quick_init(cls)


def test_refuses_an_initvar_its_init_would_drop() -> None:
    # ``dataclasses.fields`` leaves InitVars out; without ``__post_init__`` the dataclass's
    # own ``__init__`` still takes one: a quick one without it would refuse such a call.
    @dataclass(frozen=True, slots=True)
    class WithInitVar:
        a: int
        b: dataclasses.InitVar[int] = 0

    assert WithInitVar(1, 2) == WithInitVar(1)
    with pytest.raises(TypeError):
        quick_init(WithInitVar)


def test_a_field_named_as_its_helpers_is_built_the_same() -> None:
    @dataclass(frozen=True, slots=True)
    class Own:
        _set_a: int
        a: int = 1

    ours = quick_init(
        dataclass(frozen=True, slots=True)(
            type("Own", (), {"__annotations__": {"_set_a": "int", "a": "int"}, "a": 1})
        )
    )
    assert dataclasses.astuple(ours(5, 6)) == dataclasses.astuple(Own(5, 6))
