"""The OpenMP wait policy a server sets before its model libraries load, for itself and its engine cores."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from omni_gateway.engine.frontend.idle_threads import SLEEPING_WORKERS, sleep_idle_workers


def test_idle_workers_sleep_unless_the_user_chose(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    sleep_idle_workers()
    assert os.environ["OMP_WAIT_POLICY"] == SLEEPING_WORKERS["OMP_WAIT_POLICY"] == "PASSIVE"
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    sleep_idle_workers()
    assert os.environ["OMP_WAIT_POLICY"] == "ACTIVE"


def test_loading_a_backend_sets_it_before_torch_loads() -> None:
    # A fresh interpreter, watching its imports: when torch first loads, the policy must already be set.
    code = """
import importlib.abc, os, sys
seen = []
class Spy(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "torch" and not seen:
            seen.append(os.environ.get("OMP_WAIT_POLICY"))
sys.meta_path.insert(0, Spy())
from omni_gateway.omni import load_backend
try:
    load_backend(None)  # no config: fails as it starts loading
except AttributeError:
    pass
import torch  # the models' first import, where load_backend did not get that far
sys.exit(0 if seen == ["PASSIVE"] else f"torch loaded with OMP_WAIT_POLICY {seen}")
"""
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    run = subprocess.run([sys.executable, "-c", code], env=env, timeout=300, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]
