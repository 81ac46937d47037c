"""The README's two commands are the ones that work: CI runs the test command verbatim."""

import os
import re

ROOT = os.path.join(os.path.dirname(__file__), os.pardir)


def readme_commands():
    text = open(os.path.join(ROOT, "README.md")).read()
    return re.findall(r"```bash\n(python3\.11 -m venv .*?)\n```", text)


def test_ci_runs_the_readme_test_command():
    commands = readme_commands()
    assert len(commands) == 2
    main_job, tests = commands
    assert tests.endswith("-m pytest") and "diffusers-tpu generate" in main_job
    ci = open(os.path.join(ROOT, ".ci", "run")).read()
    assert tests in ci.splitlines()


def test_both_commands_install_torch_first():
    for command in readme_commands():
        steps = command.split(" && ")
        assert steps[1] == ".venv/bin/pip install torch==2.13.0"


def test_readme_is_short_says_what_it_is_not_and_every_link_resolves():
    text = open(os.path.join(ROOT, "README.md")).read()
    assert len(text.splitlines()) <= 250
    top = "\n".join(text.splitlines()[:30])
    assert "never run on a real TPU" in top
    links = re.findall(r"\]\(([^)#]+)\)", text)
    local = [link for link in links if not link.startswith("http")]
    assert {
        "docs/porting.md",
        "docs/planner.md",
        "docs/kernels.md",
        "docs/pods.md",
        "docs/staged-runs.md",
        "docs/faults.md",
        "docs/layout.md",
    } <= set(local)
    assert all(os.path.exists(os.path.join(ROOT, link)) for link in local), [
        link for link in local if not os.path.exists(os.path.join(ROOT, link))
    ]
    notebooks = sorted(f"notebooks/{name}" for name in os.listdir(os.path.join(ROOT, "notebooks")))
    assert all(name in local for name in notebooks)
    for page in os.listdir(os.path.join(ROOT, "docs")):  # the pages' own links resolve too
        body = open(os.path.join(ROOT, "docs", page)).read()
        for link in re.findall(r"\]\(([^)#]+)\)", body):
            if not link.startswith("http"):
                assert os.path.exists(os.path.join(ROOT, "docs", link)), (page, link)
