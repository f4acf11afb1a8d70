"""A program multiprocessing's spawn cannot re-import is refused before any process starts, with a hint."""

from __future__ import annotations

import subprocess
import sys
import types
from pathlib import Path

import pytest
from omni_gateway.engine.parallel.spawnable import UnspawnableMain, check_spawnable


def _with_main(monkeypatch: pytest.MonkeyPatch, **attributes: object) -> None:
    main = types.ModuleType("__main__")
    main.__spec__ = None
    for name, value in attributes.items():
        setattr(main, name, value)
    monkeypatch.setitem(sys.modules, "__main__", main)


def test_a_script_read_from_standard_input_is_refused_with_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    _with_main(monkeypatch, __file__="<stdin>")
    with pytest.raises(UnspawnableMain, match=r"tensor_parallel_size 2 .*'<stdin>'.*python script\.py"):
        check_spawnable("tensor_parallel_size 2")


def test_a_script_file_python_c_and_python_m_can_spawn(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    script = tmp_path / "serve.py"
    script.write_text("")
    _with_main(monkeypatch, __file__=str(script))
    check_spawnable("tensor_parallel_size 2")
    _with_main(monkeypatch)  # python -c, or an interactive interpreter: no __file__
    check_spawnable("tensor_parallel_size 2")
    _with_main(monkeypatch, __file__="<stdin>", __spec__=types.SimpleNamespace(name="app"))  # python -m app
    check_spawnable("tensor_parallel_size 2")


def test_the_check_sees_what_spawn_would_fail_on() -> None:
    # The same program on standard input: refused with the hint, where spawn itself would say only
    # "exited with code 1" from the child.
    program = (
        "from omni_gateway.engine.parallel.spawnable import check_spawnable\n"
        "try:\n    check_spawnable('tensor_parallel_size 2')\nexcept RuntimeError as exc:\n    print(exc)\n"
    )
    python = sys.executable
    piped = subprocess.run([python, "-"], input=program, capture_output=True, text=True, timeout=60)
    inline = subprocess.run([python, "-c", program], capture_output=True, text=True, timeout=60)
    assert "not a file they can read" in piped.stdout, piped.stderr
    assert inline.stdout == "", inline.stderr
