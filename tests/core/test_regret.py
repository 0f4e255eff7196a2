"""Post-compaction regret (core/regret.py): a call repeated after the view dropped it."""

from __future__ import annotations

from typing import Any

from proxy.core.regret import dropped, repeated


def _call(call_id: str, step: int, name: str = "read_file") -> dict[str, Any]:
    function = {"name": name, "arguments": f'{{"step": {step}}}'}
    return {
        "role": "assistant",
        "tool_calls": [{"id": call_id, "type": "function", "function": function}],
    }


def _result(call_id: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": "contents " * 50}


def test_a_call_whose_message_or_result_the_view_left_out_is_dropped() -> None:
    history: list[Any] = [
        {"role": "system", "content": "s"},
        _call("a", 1),
        _result("a"),
        _call("b", 2),
        _result("b"),
        _call("c", 3),
        _result("c"),
    ]
    summary = {"role": "user", "content": "summary"}
    elided = {**history[4], "content": "[elided]"}  # a new message: b's result is gone
    view = [history[0], summary, history[3], elided, history[5], history[6]]
    gone = dropped(history, view)
    assert repeated([_call("d", 1)], gone) == 1  # its call was summarized away
    assert repeated([_call("e", 2)], gone) == 1  # its result was elided
    assert repeated([_call("f", 3)], gone) == 0  # still in sight
    assert repeated([_call("g", 1, name="other")], gone) == 0  # another tool
    assert repeated([_call("h", 1), _call("i", 2)], gone) == 2
    assert dropped(history, history) == frozenset()
