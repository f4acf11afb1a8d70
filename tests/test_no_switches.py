"""No module-level switch that other code flips: nothing in the product folders or benchmarks/ assigns to an
attribute of a module or class it imported from this project (``LlamaModel.X = ...``, ``row_fusion.X = ...``,
``setattr(module, ...)``). A variant that must stay selectable is a field of a frozen config
(engine/config.py); one that lost is deleted. Checked on the source (AST), scope by scope, so that a local
name which shadows an import (a parameter, an assignment) is not taken for it."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("engine", "kernels", "omni", "encoders", "gateway", "benchmarks")
OURS = ("omni_gateway", "benchmarks", "tests")  # top-level names our imports start with
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)


def _own_nodes(scope: ast.AST) -> Iterator[ast.AST]:
    """The nodes of ``scope`` itself: nested functions and classes are yielded, not entered."""
    stack = list(ast.iter_child_nodes(scope))
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, _SCOPES):
            stack.extend(ast.iter_child_nodes(node))


def _bindings(scope: ast.AST) -> tuple[set[str], set[str]]:
    """Names ``scope`` binds: (by an import of ours, by anything else)."""
    imported: set[str] = set()
    other: set[str] = set()
    if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
        a = scope.args
        other |= {arg.arg for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg] if arg}
    for node in _own_nodes(scope):
        if isinstance(node, ast.Import):
            for alias in node.names:
                bound = alias.asname or alias.name.split(".")[0]
                (imported if alias.name.split(".")[0] in OURS else other).add(bound)
        elif isinstance(node, ast.ImportFrom):
            ours = node.level > 0 or (node.module or "").split(".")[0] in OURS
            for alias in node.names:
                if alias.name != "*":
                    (imported if ours else other).add(alias.asname or alias.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            other.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            other.add(node.name)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            other.add(node.name)
    return imported, other


def _targets(node: ast.AST) -> Iterator[ast.AST]:
    """The assignment targets of ``node``, tuples and starred targets unpacked."""
    if isinstance(node, ast.Assign):
        pending = list(node.targets)
    elif isinstance(node, ast.AugAssign) or (isinstance(node, ast.AnnAssign) and node.value is not None):
        pending = [node.target]
    else:
        return
    while pending:
        target = pending.pop()
        if isinstance(target, (ast.Tuple, ast.List)):
            pending.extend(target.elts)
        elif isinstance(target, ast.Starred):
            pending.append(target.value)
        else:
            yield target


def _root(node: ast.AST) -> str | None:
    """``a`` of the attribute chain ``a.b.c``; None for anything else (a subscript, a call)."""
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _scan(scope: ast.AST, inherited: set[str], found: list[str]) -> None:
    imported, other = _bindings(scope)
    visible = (inherited | imported) - other
    for node in _own_nodes(scope):
        if isinstance(node, _SCOPES):
            # a class body's names are not visible in its methods
            _scan(node, inherited if isinstance(scope, ast.ClassDef) else visible, found)
            continue
        for target in _targets(node):
            if isinstance(target, ast.Attribute) and _root(target) in visible:
                found.append(f"line {target.lineno}: {ast.unparse(target)} = ...")
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "setattr"
            and node.args
            and _root(node.args[0]) in visible
        ):
            found.append(f"line {node.lineno}: {ast.unparse(node)}")


def imported_attribute_writes(source: str) -> list[str]:
    """Each assignment in ``source`` to an attribute of a name it imported from this project."""
    found: list[str] = []
    _scan(ast.parse(source), set(), found)
    return sorted(found)


def test_no_source_file_flips_an_imported_attribute() -> None:
    offenders = [
        f"{path.relative_to(ROOT)} {write}"
        for folder in FOLDERS
        for path in sorted((ROOT / folder).rglob("*.py"))
        for write in imported_attribute_writes(path.read_text(encoding="utf-8"))
    ]
    assert not offenders, "imported modules or classes of ours mutated (use a config field):\n" + "\n".join(offenders)


@pytest.mark.parametrize(
    "source",
    [
        "from omni_gateway.engine.models.llama import LlamaModel\nLlamaModel.ROW_FUSION = False",
        "from omni_gateway.kernels import row_fusion\ndef f():\n    row_fusion.DEPENDENT_LAUNCH = False",
        "import omni_gateway.kernels.int4_fragments as fr\nfr.ENABLED = flag = False",
        "import omni_gateway.engine.models.llama\nomni_gateway.engine.models.llama.LlamaModel.ROW_STREAM = False",
        "def f():\n    from omni_gateway.kernels import int4_fragments\n    int4_fragments.ENABLED, n = False, 1",
        "from . import sibling\nsibling.COUNT += 1",
        "from benchmarks.lib import common\nsetattr(common, 'RESULTS_DIR', None)",
        "from omni_gateway.engine import config\nclass A:\n    def f(self):\n        config.DEFAULT = 1",
        "from omni_gateway.engine import config\ndef f():\n    def g():\n        config.DEFAULT: int = 1",
    ],
)
def test_checker_flags_writes_to_imported_attributes(source: str) -> None:
    assert len(imported_attribute_writes(source)) == 1, source


@pytest.mark.parametrize(
    "source",
    [
        "class A:\n    def f(self):\n        self.x = 1",
        "import torch\ntorch.backends.cudnn.benchmark = True",  # not ours
        "from omni_gateway.engine.config import EngineConfig\ncfg = EngineConfig()\ncfg.x = 1",
        "from omni_gateway.kernels import gemv\ndef f(gemv):\n    gemv.x = 1",  # a parameter shadows it
        "from omni_gateway.engine import config\ndef f():\n    config = make()\n    config.x = 1",
        "class A:\n    X = 1\nA.X = 2",  # a class of this module
        "from omni_gateway.kernels import gemv\nclass A:\n    gemv = None\n    def f(self):\n        self.gemv.x = 1",
        "from omni_gateway.engine import config\nconfig.TABLE[0] = 1\nx = config.DEFAULT",  # contents, a read
    ],
)
def test_checker_leaves_local_objects_alone(source: str) -> None:
    assert imported_attribute_writes(source) == [], source
