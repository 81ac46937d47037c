"""torch's private device named by another backend first (TorchTPU's "tpu"): ``import diffusers_tpu`` works, a
pipeline's ``to("tpu")`` gives stock's video on JAX, and what TorchTPU owns stays TorchTPU's (``shared_device``).

Each case is a fresh process (torch lets the device be named once). With torch-tpu installed (the ``beside-torchtpu``
nox cell, docs/stacks.md) TorchTPU's own set-up runs; everywhere else the rename a backend makes stands in for it.
"""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

WORKER = os.path.join(os.path.dirname(__file__), os.pardir, "workers", "shared_device_worker.py")
OWNED = ["compile", "set_float32_matmul_precision", "Generator"]


def _run(mode: str, tmp_path) -> dict:
    done = subprocess.run(
        [sys.executable, WORKER, mode], cwd=tmp_path, capture_output=True, text=True, timeout=900, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _shared(found: dict) -> None:
    assert found["pipe_device"] == "tpu:0"  # JAX tensors report the shared device
    assert found["torch_device_target"] == "tpu"  # pipe.to(torch.device("tpu")) is the JAX path too
    assert found["max_abs"] <= 1e-4  # stock's video
    assert found["unchanged_while_active"] == OWNED and found["unchanged_after_deactivate"] == OWNED
    assert found["device_after_deactivate"] == "tpu"


TORCHTPU = importlib.util.find_spec("torch_tpu") is not None


@pytest.mark.skipif(TORCHTPU, reason="torch-tpu is installed: its own set-up runs (test_beside_torchtpu)")
def test_a_device_named_tpu_first_is_shared(tmp_path):
    _shared(_run("tpu", tmp_path))


def test_a_device_named_by_another_backend_is_refused_in_one_line(tmp_path):
    found = _run("npu", tmp_path)
    refusal = found["refused"]
    assert refusal.startswith("DeviceTaken:") and "'npu'" in refusal and "TORCH_DEVICE_BACKEND_AUTOLOAD=0" in refusal
    assert "\n" not in refusal


BACKEND = """import types

import torch


def load():  # what a PyTorch device backend's autoload does: the rename, and its device module
    torch.utils.rename_privateuse1_backend("npu")
    module = types.ModuleType("torch.npu")
    module.is_available, module.device_count = (lambda: False), (lambda: 0)
    torch._register_device_module("npu", module)
"""


def test_its_fix_works(tmp_path):
    """The refusal's fix, done: a backend that torch autoloads (a ``torch.backends`` entry point) takes the device;
    started with TORCH_DEVICE_BACKEND_AUTOLOAD=0, the same process runs diffusers_tpu with torchax's "jax"."""
    site = tmp_path / "site"
    (site / "npu_backend-0.1.dist-info").mkdir(parents=True)
    (site / "npu_backend.py").write_text(BACKEND)
    (site / "npu_backend-0.1.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: npu-backend\nVersion: 0.1\n"
    )
    (site / "npu_backend-0.1.dist-info" / "entry_points.txt").write_text("[torch.backends]\nnpu = npu_backend:load\n")
    script = "import torch, diffusers_tpu, diffusers; print(torch.device('jax'))"
    env = {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}

    def run(**extra):
        return subprocess.run(
            [sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, env={**env, **extra}
        )

    refused = run()
    assert refused.returncode != 0 and "DeviceTaken: torch's private device is already named 'npu'" in refused.stderr
    fixed = run(TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    assert fixed.returncode == 0 and fixed.stdout.strip() == "jax", fixed.stderr[-2000:]


@pytest.mark.skipif(not TORCHTPU, reason="torch-tpu is not installed (the beside-torchtpu nox cell)")
def test_beside_torchtpu(tmp_path):
    found = _run("torchtpu", tmp_path)
    _shared(found)
    assert found["torchtpu_runtime_started"] is False  # JAX holds the chips: TorchTPU's runtime never starts
