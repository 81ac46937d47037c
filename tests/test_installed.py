"""Installed as users install it, not as an editable checkout: the wheel into a fresh venv that already holds today's
libraries, used from an empty folder outside the clone; and the notebooks' install cell run as on Colab, in a fresh
venv without the project, from a clone named by ``DIFFUSERS_TPU_REPOSITORY``.

Each venv gets ``torch==2.13.0`` first (README: any other torch spec may pull a CUDA build of several GB), as Colab
ships its own torch; everything else comes from the package index (pip's cache after the first run).
"""

import json
import os
import subprocess
import sys

import nbformat
import pytest

from tests.test_packaging import ROOT, build_distributions, copy_checkout

WORKER = os.path.join(ROOT, "tests", "workers", "shared_device_worker.py")
# a release newer than the cap `transformers<5.25` that main once declared: the user's stays
TODAYS_TRANSFORMERS = "5.25.0"


def _env(**extra) -> dict:
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return {**env, **extra}


def _run(command, cwd, timeout=1200, **extra) -> str:
    done = subprocess.run(
        [str(part) for part in command], cwd=cwd, capture_output=True, text=True, env=_env(**extra), timeout=timeout
    )
    assert done.returncode == 0, f"{command}\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    return done.stdout


def _venv(path) -> str:
    """A fresh venv with torch 2.13.0 (CPU) in it; its bin folder."""
    _run([sys.executable, "-m", "venv", path], cwd=ROOT)
    _run([os.path.join(path, "bin", "pip"), "install", "-q", "torch==2.13.0"], cwd=ROOT)
    return os.path.join(path, "bin")


def _version(bin_folder, name) -> str:
    script = f"from importlib.metadata import version; print(version({name!r}))"
    return _run([os.path.join(bin_folder, "python"), "-c", script], cwd=ROOT).strip()


@pytest.mark.slow  # minutes: CI's second command (setup.cfg)
def test_the_wheel_installed_in_a_users_venv(tmp_path):
    _, wheel = build_distributions(tmp_path / "build")
    venv = _venv(tmp_path / "venv")
    _run([os.path.join(venv, "pip"), "install", "-q", f"transformers=={TODAYS_TRANSFORMERS}"], cwd=tmp_path)
    _run([os.path.join(venv, "pip"), "install", "-q", wheel], cwd=tmp_path)
    assert _version(venv, "transformers") == TODAYS_TRANSFORMERS  # the user's newer library stays
    _run([os.path.join(venv, "pip"), "check"], cwd=tmp_path)

    empty = tmp_path / "empty"
    empty.mkdir()
    assert "generate" in _run([os.path.join(venv, "diffusers-tpu"), "--help"], cwd=empty)
    _run([os.path.join(venv, "diffusers-tpu"), "generate", "--output", "video.mp4"], cwd=empty)
    assert (empty / "video.mp4").stat().st_size > 0
    found = json.loads(_run([os.path.join(venv, "python"), WORKER, "none"], cwd=empty).strip().splitlines()[-1])
    assert found["imported_from"].startswith(str(tmp_path / "venv"))  # the installed copy, not the checkout
    assert found["max_abs"] <= 1e-4  # a tiny Wan on JAX, 1 device, against stock torch CPU


@pytest.mark.slow
def test_the_notebooks_install_cell_as_on_colab(tmp_path):
    """A fresh venv without the project (Colab's: torch and Jupyter), the notebook opened outside any clone with
    ``DIFFUSERS_TPU_REPOSITORY`` set: its first cell clones and installs (not editable), the second imports, and the
    notebook runs to its end on the demo model."""
    repository = tmp_path / "repository"  # the working tree as a git repository: what `git clone` reads
    copy_checkout(repository)
    git = ["git", "-c", "user.name=ci", "-c", "user.email=ci@localhost"]
    _run(["git", "init", "-q"], cwd=repository)
    _run(["git", "add", "-A"], cwd=repository)
    _run([*git, "commit", "-q", "-m", "snapshot"], cwd=repository)

    venv = _venv(tmp_path / "venv")
    _run([os.path.join(venv, "pip"), "install", "-q", "nbclient", "nbformat", "ipykernel"], cwd=tmp_path)
    opened = tmp_path / "opened"  # where Colab runs a notebook: no clone around it
    opened.mkdir()
    notebook = nbformat.read(os.path.join(ROOT, "notebooks", "wan_t2v.ipynb"), as_version=4)
    assert "DIFFUSERS_TPU_REPOSITORY" in notebook.cells[1].source  # the install cell
    nbformat.write(notebook, opened / "wan_t2v.ipynb")
    script = (
        "import nbformat, sys\nfrom nbclient import NotebookClient\n"
        "notebook = nbformat.read('wan_t2v.ipynb', as_version=4)\n"
        "client = NotebookClient(notebook, timeout=900, kernel_name='python3', resources={'metadata': {'path': '.'}})\n"
        "client.execute()\n"
        "print(''.join(out.get('text', '') for cell in notebook.cells if cell.cell_type == 'code'"
        " for out in cell.get('outputs', [])))"
    )
    outputs = _run([os.path.join(venv, "python"), "-c", script], cwd=opened, DIFFUSERS_TPU_REPOSITORY=str(repository))
    assert "real model: False" in outputs and "the analyser reads: blue shape moving up" in outputs
    assert (opened / "wan_t2v.mp4").stat().st_size > 0
    where = _run(
        [os.path.join(venv, "python"), "-c", "import diffusers_tpu; print(diffusers_tpu.__file__)"], cwd=opened
    )
    assert where.strip().startswith(str(tmp_path / "venv"))  # installed into the venv, not editable


def test_every_notebook_installs_the_same_way():
    """The Colab path tested above is every notebook's: their install cells are one text."""
    cells = {
        name: nbformat.read(os.path.join(ROOT, "notebooks", name), as_version=4).cells[1].source
        for name in os.listdir(os.path.join(ROOT, "notebooks"))
        if name.endswith(".ipynb")
    }
    assert len(cells) == 4 and len(set(cells.values())) == 1, sorted(cells)
