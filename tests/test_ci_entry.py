"""CI runs exactly the test command the README gives."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ci_runs_the_readme_test_command() -> None:
    readme_commands = re.findall(r"```bash\n(.+?)\n```", (ROOT / "README.md").read_text())
    assert len(readme_commands) >= 2, "README must open with the serve command and the test command"
    test_command = readme_commands[1]
    assert "pytest" in test_command
    ci_lines = [
        line
        for line in (ROOT / ".ci" / "run").read_text().splitlines()
        if line.strip() and not line.startswith("#") and not line.startswith(("set ", "cd "))
    ]
    assert ci_lines == [test_command]


def test_readme_serve_command_ends_in_omni_serve() -> None:
    serve_command = re.findall(r"```bash\n(.+?)\n```", (ROOT / "README.md").read_text())[0]
    assert serve_command.endswith("&& omni serve")
