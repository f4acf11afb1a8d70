"""The LoRA calls an engine core has not answered yet: the adapter list is updated before the caller wakes."""

from __future__ import annotations

import pytest
from omni_gateway.engine.frontend.lora_calls import PendingLoraCalls, with_adapter


def test_the_adapter_list_changes_before_the_caller_wakes() -> None:
    calls = PendingLoraCalls()
    modules: list[tuple[tuple[str, str], ...]] = [(("all", "/a"),)]
    seen_by_caller: list[tuple[tuple[str, str], ...]] = []
    ticket, future = calls.open("attn", "/b")
    future.add_done_callback(lambda _: seen_by_caller.append(modules[0]))

    def applied(name: str, path: str | None) -> None:
        modules[0] = with_adapter(modules[0], name, path)

    calls.close(ticket, None, applied)
    assert seen_by_caller == [(("all", "/a"), ("attn", "/b"))]
    calls.close(ticket, None, applied)  # answered twice (a stale reply): ignored
    assert modules[0] == (("all", "/a"), ("attn", "/b"))


def test_a_failed_call_leaves_the_list_alone_and_raises_for_its_caller() -> None:
    calls = PendingLoraCalls()
    ticket, future = calls.open("attn", None)
    applied: list[tuple[str, str | None]] = []
    calls.close(ticket, ValueError("no such adapter"), lambda n, p: applied.append((n, p)))
    assert applied == []
    with pytest.raises(ValueError, match="no such adapter"):
        future.result(timeout=0)


def test_unloading_removes_only_that_adapter() -> None:
    assert with_adapter((("a", "/a"), ("b", "/b")), "a", None) == (("b", "/b"),)
    assert with_adapter((("a", "/a"),), "a", "/a2") == (("a", "/a2"),)
