"""The code passes the project's ruff configuration (``[tool.ruff]`` in pyproject.toml): format and lint.

Lint includes imports at the top of library modules (``PLC0415``; the command line, the tests and the package's
``__init__`` are exempt: they import late on purpose) and sorted imports."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _ruff(*args: str, source: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ruff", *args], cwd=ROOT, capture_output=True, text=True, timeout=300, input=source
    )


@pytest.mark.parametrize("command", [("check", "."), ("format", "--check", ".")], ids=["lint", "format"])
def test_ruff_passes(command):
    result = _ruff(*command)
    assert result.returncode == 0, (
        f"ruff {' '.join(command)} failed (`.venv/bin/python -m ruff format .` formats; what the lint lists is "
        f"fixed by hand):\n{result.stdout[-4000:]}{result.stderr[-2000:]}"
    )


LATE_IMPORT = '"""A module."""\n\n\ndef late():\n    import json\n\n    return json\n'


@pytest.mark.parametrize(
    "path, flagged",
    [
        ("diffusers_tpu/runtime/late.py", True),
        ("kernels/late.py", True),
        ("diffusers_tpu/commands/late.py", True),
        ("diffusers_tpu/commands/cli.py", False),
        ("tests/test_late.py", False),
    ],
)
def test_a_late_import_fails_the_lint_in_library_modules_only(path, flagged):
    result = _ruff("check", "--no-cache", "--stdin-filename", path, "-", source=LATE_IMPORT)
    assert ("PLC0415" in result.stdout) == flagged and result.returncode == int(flagged), result.stdout


UNSORTED = (
    '"""A module."""\n\nimport sys\nimport os\n\nfrom diffusers_tpu.interop import patching\nimport torch\n\n'
    "print(os, sys, torch, patching)\n"
)


def test_the_fixes_the_readme_names_do_what_it_says():
    """README: ``ruff format .`` formats, ``ruff check --fix .`` sorts imports; the fixed source then passes."""
    path = "diffusers_tpu/runtime/unsorted.py"
    assert _ruff("check", "--no-cache", "--stdin-filename", path, "-", source=UNSORTED).returncode == 1
    fixed = _ruff("check", "--no-cache", "--fix", "--stdin-filename", path, "-", source=UNSORTED).stdout
    formatted = _ruff("format", "--no-cache", "--stdin-filename", path, "-", source=fixed).stdout
    assert _ruff("check", "--no-cache", "--stdin-filename", path, "-", source=formatted).returncode == 0
    assert _ruff("format", "--check", "--no-cache", "--stdin-filename", path, "-", source=formatted).returncode == 0
    assert formatted.index("import os") < formatted.index("import sys") < formatted.index("import torch")
