"""Declared = tested: ``interop.versions.TESTED`` is what setup.cfg declares and what the version matrix spans, and a
version outside it gets one warning at import (inside: silence)."""

import ast
import configparser
import os
import re
import subprocess
import sys

import pytest

from diffusers_tpu.interop import versions

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))


@pytest.mark.parametrize(
    "version, specifier, expected",
    [
        ("2.13.0+cpu", ">=2.13,<2.16", True),
        ("2.15.0", ">=2.13,<2.16", True),
        ("2.16.0", ">=2.13,<2.16", False),
        ("2.12.1", ">=2.13,<2.16", False),
        ("0.12.0.1", ">=0.10.2,<0.13", True),
        ("0.10.1", ">=0.10.2,<0.13", False),
        ("5.24.0.dev0", ">=4.57,<5.25", True),
        ("5.25.0", ">=4.57,<5.25", False),
        ("0.0.13", "==0.0.13", True),
        ("0.0.14", "==0.0.13", False),
    ],
)
def test_a_version_meets_a_specifier(version, specifier, expected):
    assert versions.satisfies(version, specifier) is expected


def _declared() -> dict[str, list[tuple[str, str]]]:
    """setup.cfg's install_requires and extras, raw: each requirement line with the line above it."""
    found, section, above = {}, None, ""
    for line in open(os.path.join(ROOT, "setup.cfg")).read().splitlines():
        if line and not line[0].isspace():
            section = line.split("=")[0].strip() if line.rstrip().endswith("=") else None
            found.setdefault(section, [])
        elif section and line.strip() and not line.strip().startswith("#"):
            found[section].append((line.strip(), above.strip()))
        above = line
    return found


def _name(requirement: str) -> str:
    return re.split(r"[<>=~!\[;]", requirement, maxsplit=1)[0].strip()


def test_setup_cfg_declares_the_tested_lower_bounds():
    config = configparser.ConfigParser()
    config.read(os.path.join(ROOT, "setup.cfg"))
    assert config["options"]["python_requires"] == versions.TESTED["python"].split(",")[0]
    sections = _declared()
    declared = {
        _name(line): line for lines in (sections["torchtpu"], sections["install_requires"]) for line, _ in lines
    }
    for name, tested in versions.TESTED.items():
        if name != "python":
            lower = tested.split(",")[0]
            assert lower.startswith((">=", "==")) and ">=" + lower.lstrip(">=") in declared[name], (
                name,
                declared[name],
            )


def test_no_upper_bound_without_its_reason():
    """A cap makes pip replace a user's newer library with an older one (transformers<5.25 took 5.25.0 back to 5.24.0):
    one stands only for a known incompatibility, said on the line above it."""
    capped = [
        (line, above)
        for lines in _declared().values()
        for line, above in lines
        if re.search(r"<|==|~=", line.split(";")[0]) and not line.startswith("jax[tpu]")
    ]
    assert [line for line, above in capped if not above.startswith("# known incompatibility:")] == []


def _cells() -> dict:
    tree = ast.parse(open(os.path.join(ROOT, "noxfile.py")).read())
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "CELLS":
            return eval(compile(ast.Expression(node.value), "noxfile.py", "eval"), {"dict": dict})  # noqa: S307
    raise AssertionError("noxfile.py has no CELLS")


def test_the_matrix_spans_what_is_declared():
    """Every cell's pins lie inside the span, the oldest cell stands on its lower ends, and a cell runs each Python
    the span admits (3.10: the refusal's row)."""
    cells = _cells()
    for name, (python, pins) in cells.items():
        if python == "3.10":
            continue
        assert versions.satisfies(python, versions.TESTED["python"]), name
        for library, version in pins.items():
            if version is not None:
                assert versions.satisfies(version, versions.TESTED[library]), (name, library, version)
    oldest = cells["oldest"][1]
    for library in ("torch", "jax", "diffusers", "transformers"):
        lower = versions.TESTED[library].split(",")[0].removeprefix(">=")
        assert versions.release(oldest[library])[: len(versions.release(lower))] == versions.release(lower), library
    assert {python for python, _ in cells.values()} >= {"3.11", "3.12", "3.13"}


def test_inside_the_span_is_silent_and_outside_is_one_warning_naming_it():
    assert versions.outside(versions.installed()) == []  # this suite runs inside the span
    assert versions.warn_outside() is False
    with pytest.warns(versions.UntestedVersionWarning) as caught:
        versions.warn_outside({"python": "3.11.7", "torch": "2.16.0", "diffusers": "0.37.1", "jax": "0.10.2"})
    assert len(caught) == 1
    message = str(caught[0].message)
    assert "torch 2.16.0 (tested: >=2.13,<2.16)" in message and "diffusers 0.37.1 (tested: >=0.38,<0.43)" in message
    assert "jax 0.10.2" not in message and "python" not in message


_IMPORT = """
import importlib.metadata, warnings
stock = importlib.metadata.version
importlib.metadata.version = lambda name: {FAKE}.get(name) or stock(name)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import diffusers_tpu
print([str(w.message) for w in caught if w.category.__name__ == "UntestedVersionWarning"])
"""


@pytest.mark.parametrize("fake, expected", [({}, 0), ({"diffusers": "0.44.0"}, 1)])
def test_import_warns_once_for_a_version_outside_the_span(fake, expected):
    result = subprocess.run(
        [sys.executable, "-c", _IMPORT.replace("{FAKE}", repr(fake))],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    messages = ast.literal_eval(result.stdout.strip().splitlines()[-1])
    assert len(messages) == expected, messages
    if expected:
        assert "diffusers 0.44.0 (tested: >=0.38,<0.43)" in messages[0]


@pytest.mark.parametrize("libtpu, unmet", [("0.0.42.1", True), ("0.0.52", False)])
def test_torchtpu_without_its_libtpu_is_named_with_the_fix(monkeypatch, libtpu, unmet):
    """The [tpu] extra on Python 3.11 replaces TorchTPU's libtpu (>=0.0.50) with jax 0.10.2's 0.0.42.1: named once at
    import, with the install that gives it back (checked by doing it: docs/stacks.md)."""
    requires = {"torch-tpu": ["numpy>=2", "libtpu>=0.0.50", "torch<=2.15.0,>=2.11.0"]}
    monkeypatch.setattr(versions.importlib.metadata, "requires", lambda name: requires[name])
    monkeypatch.setattr(versions.importlib.metadata, "version", lambda name: {"libtpu": libtpu}[name])
    found = versions.torchtpu_libtpu_unmet()
    if unmet:
        assert f"libtpu {libtpu} is installed" in found and "pip install 'libtpu>=0.0.50'" in found
    else:
        assert found is None
