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
