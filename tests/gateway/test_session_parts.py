"""The parts of ``RealtimeSession`` call one way: each part module imports only the parts before it in ``ORDER``,
and no part is a mixin of the session (a mixin could call any other part through ``self``)."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest
from omni_gateway.gateway.realtime import (
    session,
    session_audio,
    session_config,
    session_core,
    session_items,
    session_responses,
    session_tasks,
)

PACKAGE = "omni_gateway.gateway.realtime"
REALTIME = Path(session.__file__).parent
# Lowest first: a part may use the parts before it, never one after it (session.py's docstring says why).
ORDER = ("session_core", "session_responses", "session_items", "session_audio", "session_config", "session_tasks")
MODULES = (session_core, session_responses, session_items, session_audio, session_config, session_tasks, session)


def imported_parts(module: str) -> set[str]:
    """The session modules ``module`` imports, wherever the import stands (TYPE_CHECKING blocks included)."""
    tree = ast.parse((REALTIME / f"{module}.py").read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module is not None:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        for name in names:
            if name.startswith(PACKAGE + "."):
                leaf = name.removeprefix(PACKAGE + ".").split(".")[0]
                if leaf == "session" or leaf.startswith("session_"):
                    found.add(leaf)
    return found


def test_every_session_module_has_its_place_in_the_order() -> None:
    on_disk = {path.stem for path in REALTIME.glob("session_*.py")}
    assert on_disk == set(ORDER), f"place each part in ORDER: on disk {sorted(on_disk)}, ordered {list(ORDER)}"


@pytest.mark.parametrize("module", ORDER)
def test_a_part_imports_only_the_parts_before_it(module: str) -> None:
    allowed = set(ORDER[: ORDER.index(module)])
    above = imported_parts(module) - allowed - {module}
    assert not above, f"{module} imports {sorted(above)}, which come after it (or the session itself)"


def test_the_session_is_built_from_the_parts_not_their_subclass() -> None:
    parts = [cls for module in MODULES for _, cls in inspect.getmembers(module, inspect.isclass)]
    ours = [cls for cls in parts if cls.__module__.startswith(f"{PACKAGE}.session")]
    assert session.RealtimeSession in ours
    for cls in ours:
        bases = [base for base in cls.__mro__[1:] if base is not object]
        assert not bases, f"{cls.__name__} inherits {[b.__name__ for b in bases]}: a part is an object of its own"
