"""Whether this program can start processes with multiprocessing's spawn, said before any is started.

A spawned child first re-imports the parent's main module: from its file when the program was started
as ``python script.py``, by name for ``python -m``, not at all for ``python -c`` or an interactive
interpreter. A program read from standard input (``python - < script.py``) names a file, ``<stdin>``, that
does not exist, and every child dies at start with nothing but its exit code.
"""

from __future__ import annotations

import os
import sys


class UnspawnableMain(RuntimeError):
    """The main module cannot be re-imported by a spawned child."""


def check_spawnable(what: str) -> None:
    """Raise UnspawnableMain, saying what to do, when a spawned child could not re-import ``__main__``;
    ``what`` names what needs the processes (e.g. "tensor_parallel_size 2")."""
    main = sys.modules.get("__main__")
    if main is None or getattr(getattr(main, "__spec__", None), "name", None) is not None:
        return  # python -m: the child imports the module by name
    path = getattr(main, "__file__", None)
    if path is None:
        return  # python -c or an interactive interpreter: the child imports nothing of it
    from multiprocessing import process

    full = path if os.path.isabs(path) or process.ORIGINAL_DIR is None else os.path.join(process.ORIGINAL_DIR, path)
    if os.path.isfile(full):
        return
    raise UnspawnableMain(
        f"{what} starts worker processes with multiprocessing's spawn, which re-imports the main script in "
        f"each of them, but this program's main script ({path!r}) is not a file they can read (a script "
        "piped on standard input?). Save it to a file and run `python script.py`, with the engine created "
        'under `if __name__ == "__main__":`, or run the code with `python -c`.'
    )
