"""docs/layout.md lists every module of the package in one line, and nothing that is not there."""

import os
import re
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def modules_in_tree() -> set[str]:
    listed = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    found = set()
    for path in listed or []:
        if path.endswith(".py") and not path.endswith("__init__.py"):
            if path.startswith("kernels/"):
                found.add(path)
            elif path.startswith("diffusers_tpu/"):
                found.add(path.removeprefix("diffusers_tpu/"))
    return found


def modules_in_doc(text: str) -> set[str]:
    """The modules named at the head of a list line: "- `room/module.py` — what it holds"."""
    return set(re.findall(r"^- `([\w/]+\.py)`", text, flags=re.M))


def test_every_module_has_its_line_and_every_line_a_module():
    text = open(os.path.join(ROOT, "docs", "layout.md"), encoding="utf-8").read()
    tree, doc = modules_in_tree(), modules_in_doc(text)
    assert len(tree) > 100
    assert sorted(tree - doc) == [] and sorted(doc - tree) == []


def test_the_check_sees_a_missing_and_a_stale_line():
    assert modules_in_doc("- `runtime/call/cfg.py` — guidance\n- `runtime/gone.py` — old\n") == {
        "runtime/call/cfg.py",
        "runtime/gone.py",
    }
