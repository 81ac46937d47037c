"""The sdist and the wheel built from it hold the source tree: every module and every data file of ``diffusers_tpu/``
and ``kernels/`` (installed as ``diffusers_tpu.kernels``). A package left out of setup's list once made the wheel
unimportable (``No module named 'diffusers_tpu.runtime.attach'``) while every editable install passed."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import zipfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# what setuptools builds from (setup.py, setup.cfg, pyproject.toml, README.md for the long description)
BUILD_INPUTS = ("setup.py", "setup.cfg", "pyproject.toml", "README.md", "diffusers_tpu", "kernels")


def source_tree() -> set[str]:
    """The files the repository holds under the two package folders (tracked, or new and not ignored), as installed
    paths."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "diffusers_tpu", "kernels"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    present = [path for path in listed if os.path.isfile(os.path.join(ROOT, path))]  # deleted, not yet committed
    return {"diffusers_tpu/" + path if path.startswith("kernels/") else path for path in present}


def _build(hook: str, source: str, out: str) -> str:
    """One PEP 517 hook of setuptools, in a subprocess (it writes into the folder it builds)."""
    script = f"from setuptools import build_meta; print(build_meta.{hook}({out!r}))"
    done = subprocess.run([sys.executable, "-c", script], cwd=source, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    return os.path.join(out, done.stdout.strip().splitlines()[-1])


def copy_checkout(into) -> None:
    """What a build reads, copied from the working tree (committed or not) into the folder ``into``."""
    os.makedirs(into)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build")
    for name in BUILD_INPUTS:
        source = os.path.join(ROOT, name)
        if not os.path.exists(source):
            continue
        if os.path.isdir(source):
            shutil.copytree(source, os.path.join(into, name), ignore=ignore)
        else:
            shutil.copy2(source, os.path.join(into, name))


def build_distributions(tmp) -> tuple[str, str]:
    """The sdist from a copy of the checkout, then the wheel from the unpacked sdist (what pip does with either)."""
    copy_checkout(os.path.join(tmp, "checkout"))
    sdist = _build("build_sdist", os.path.join(tmp, "checkout"), str(tmp))
    with tarfile.open(sdist) as archive:
        archive.extractall(os.path.join(tmp, "unpacked"), filter="data")
    (unpacked,) = os.listdir(os.path.join(tmp, "unpacked"))
    return sdist, _build("build_wheel", os.path.join(tmp, "unpacked", unpacked), str(tmp))


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    sdist, wheel = build_distributions(tmp_path_factory.mktemp("packaging"))
    with tarfile.open(sdist) as archive:
        sdist_names = archive.getnames()
    with zipfile.ZipFile(wheel) as archive:
        wheel_names = archive.namelist()
        (entry_points,) = [name for name in wheel_names if name.endswith(".dist-info/entry_points.txt")]
        scripts = archive.read(entry_points).decode()
    return sdist_names, wheel_names, scripts


def test_the_wheel_holds_the_source_tree(built):
    _, wheel_names, _ = built
    installed = {name for name in wheel_names if not name.split("/")[0].endswith(".dist-info")}
    expected = source_tree()
    assert "diffusers_tpu/runtime/attach/moves.py" in expected and "diffusers_tpu/kernels/flash.py" in expected
    assert sorted(expected - installed) == [], "in the repository, missing from the wheel"
    assert sorted(installed - expected) == [], "in the wheel, not in the repository"


def test_the_sdist_holds_the_source_tree(built):
    sdist_names, _, _ = built
    inside = {name.split("/", 1)[1] for name in sdist_names if "/" in name}
    kernels = "diffusers_tpu/kernels/"
    as_in_repository = {
        path.replace(kernels, "kernels/", 1) if path.startswith(kernels) else path for path in source_tree()
    }
    assert sorted(as_in_repository - inside) == []
    assert {"setup.py", "setup.cfg", "pyproject.toml", "README.md"} <= inside


def test_the_console_script_is_declared(built):
    *_, scripts = built
    assert "diffusers-tpu = diffusers_tpu.commands.cli:main" in scripts


@pytest.mark.parametrize("installed", [True, False])
def test_kernels_by_its_top_level_name_is_the_installed_package(installed, tmp_path):
    """Run from the repository's root, ``import kernels`` (transformers >= 5.25 requires Hugging Face's ``kernels``)
    finds the installed package, not the repository's folder (with none installed, the folder as before: transformers
    5.24 imports it to read a version); ``diffusers_tpu.kernels`` is this project's either way."""
    site = tmp_path / "site"
    if installed:
        (site / "kernels").mkdir(parents=True)
        (site / "kernels" / "__init__.py").write_text("CUDAProperties = 'the installed kernels package'\n")
    script = (
        "import diffusers_tpu.kernels as ours\n"
        "import kernels\n"
        "found = getattr(kernels, 'CUDAProperties', kernels.__file__)\n"
        "print(found, '|', ours.flash_attention.__module__)"
    )
    env = {**os.environ, "PYTHONPATH": str(site)}
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    if installed:
        expected = "the installed kernels package"
    else:  # whatever this environment holds: transformers >= 5.25 brings Hugging Face's package along
        expected = _installed_kernels() or os.path.join(ROOT, "kernels", "__init__.py")
    assert done.stdout.split("\n")[-2] == f"{expected} | diffusers_tpu.kernels.flash"


def _installed_kernels():
    """What ``import kernels`` finds from outside the repository: Hugging Face's ``CUDAProperties`` when its
    package is installed, else None."""
    probe = "import kernels; print(getattr(kernels, 'CUDAProperties', None))"
    done = subprocess.run([sys.executable, "-c", probe], cwd=os.path.dirname(ROOT), capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 and done.stdout.strip() != "None" else None
