"""The version matrix (docs/stacks.md): one nox session per cell, each in a venv of its own built from this checkout.

    python -m pip install nox
    nox -s default            # README's stack; `nox -l` lists every cell
    nox -s oldest             # no CUDA download: what CI runs beside README's commands
    nox -s colab-torch2.15    # a CUDA build of torch (several GB) on Python 3.12
    nox -s beside-torchtpu    # with TorchTPU (torch-tpu) installed: pip check clean, the shared device
    nox -s newest             # the newest release of every dependency today (no upper pins): before each release

Each cell installs its torch first (the CPU build where one exists), then the project with its test extra and the
cell's pins, and runs ``benchmarks/stacks.py run CELL``: ``--help``, the demo command, the parity table (every family
against stock on one device, and on the 8-device mesh), one denoiser step and one video VAE compiled by the TPU
compiler for v5e and v6e. The results go to ``docs/stacks.json``; ``python benchmarks/stacks.py table`` writes the
table in docs/stacks.md. Interpreters are found on PATH as ``python3.X`` (with pyenv:
``PYENV_VERSION=3.11.7:3.12.1:3.13.0:3.10.13 nox ...``). A cell asking for a torch above a pip constraint of the
machine lifts it for its own installs (``PIP_CONSTRAINT=/dev/null``).
"""

from __future__ import annotations

import configparser

import nox

nox.options.default_venv_backend = "venv"
nox.options.sessions = ["default"]

# name: (python, pins). A pin of None takes the newest release (setup.cfg caps nothing without a known
# incompatibility); torch is installed before the project (its CPU build where the registry has one); py3.10 shows the
# refusal (torchax needs 3.11). `beside-torchtpu` installs TorchTPU, and the project with its `torchtpu` extra instead
# of jax[tpu] (whose libtpu pin on Python 3.11 is older than TorchTPU's): JAX 0.10.2 then runs on TorchTPU's libtpu.
CELLS = {
    "default": ("3.11", dict(torch="2.13.0", jax="0.10.2", diffusers="0.42.1", transformers=None)),
    "oldest": ("3.11", dict(torch="2.13.0", jax="0.10.2", diffusers="0.38.0", transformers="4.57.6")),
    "middle": ("3.11", dict(torch="2.13.0", jax="0.10.2", diffusers="0.40.0", transformers="5.12.1")),
    "colab-torch2.14": ("3.12", dict(torch="2.14.1", jax=None, diffusers="0.42.1", transformers=None)),
    "colab-torch2.15": ("3.12", dict(torch="2.15.0", jax=None, diffusers="0.42.1", transformers=None)),
    "newest": ("3.13", dict(torch=None, jax=None, diffusers=None, transformers=None)),
    "beside-torchtpu": (
        "3.11",
        dict(torch="2.13.0", jax="0.10.2", diffusers="0.42.1", transformers=None, **{"torch-tpu": "0.2.0"}),
    ),
    "py3.10": ("3.10", dict(torch=None, jax=None, diffusers="0.38.0", transformers="4.57.6")),
}
# torch builds this machine's pip constraint file does not admit (it caps torch at 2.14.1)
ABOVE_THE_CAP = ("2.15",)


def _pins(pins: dict) -> list[str]:
    found = [f"{name}=={version}" for name, version in pins.items() if version and name != "torch"]
    return found + ([] if pins["jax"] else ["jax[tpu]"])  # the newest jax brings its own libtpu


def _project(pins: dict) -> list[str]:
    """The project and its test tools: the `test` extra, or beside TorchTPU the `torchtpu` extra and the test extra's
    tools without jax[tpu]."""
    if "torch-tpu" not in pins:
        return ["-e", ".[test]"]
    config = configparser.ConfigParser()
    config.read("setup.cfg")
    tools = [line for line in config["options.extras_require"]["test"].split() if not line.startswith("jax[")]
    return ["-e", ".[torchtpu]", *tools]


def _cell(session: nox.Session, name: str) -> None:
    python, pins = CELLS[name]
    lifted = pins["torch"] is None or pins["torch"].startswith(ABOVE_THE_CAP)
    env = {"PIP_CONSTRAINT": "/dev/null"} if lifted else {}
    if python != "3.10":  # the project's install is refused there before torch matters
        session.install(f"torch=={pins['torch']}" if pins["torch"] else "torch", env=env)
    session.run("python", "benchmarks/stacks.py", "cell", name, "--", *_project(pins), *_pins(pins), env=env)


for _name, (_python, _) in CELLS.items():
    nox.session(python=_python, name=_name, reuse_venv=True)(lambda session, _name=_name: _cell(session, _name))
