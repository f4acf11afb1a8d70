"""Fixtures of the HTTP API tests: one live server per test module over a scripted backend."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.harness.fake_backend import FakeBackend
from tests.harness.live_server import served


@pytest.fixture(scope="module")
def live() -> Iterator[tuple[Any, str, Any]]:
    """(backend, base URL, openai client) of a server that lives as long as the test module."""
    backend = FakeBackend()
    with served(backend) as (url, client):
        yield backend, url, client


@pytest.fixture
def fake(live: tuple[Any, str, Any]) -> tuple[Any, str, Any]:
    """``live`` with the backend's script and records reset for this test."""
    live[0].reset()
    return live
