"""Shared fixtures: offline, a throwaway JAX compilation cache, and stock-vs-JAX comparison helpers."""

import json
import os
import subprocess
import sys
import tempfile
import textwrap

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("DIFFUSERS_TPU_CACHE_DIR", tempfile.mkdtemp(prefix="diffusers-tpu-test-cache-"))
# The suite compiles hundreds of tiny programs, most of them more than once (every test builds its own pipeline;
# CLI, notebook, mesh and pod subprocesses start cold). Inherited by every subprocess:
# - the run's compilation cache keeps every program, not only those over JAX's 1 s default;
# - LLVM's optimisation passes off, and XLA:CPU's older elemental emitter instead of its MLIR fusion emitters: each
#   halves XLA:CPU's compile time (a tiny Wan call: 4.0 -> 1.9 s of compiling), tiny programs run a little slower. The
#   arithmetic is the same IEEE float32 (no fast-math either way); CPU timings are never speed claims here;
# - a simulated mesh's collectives wait up to 10 minutes for their device threads (XLA:CPU's default, 40 s, killed
#   the sweep's mesh process once when four processes shared 2 cores: one thread of an all-gather starved).
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
from tests import xla_flags  # noqa: E402  (the flags this jaxlib knows: XLA aborts on others)

for _flag in xla_flags.fast_compile():
    if _flag.split("=")[0] not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _flag).strip()

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

import diffusers_tpu  # noqa: E402,F401  (registers the backend before any test builds a pipeline)
from diffusers_tpu.runtime import diffusers_private  # noqa: E402
from diffusers_tpu.testing import tiny  # noqa: E402


@pytest.fixture(autouse=True)
def _attention_backend_restored():
    """Stock's ``set_attention_backend`` makes its backend the process's active one for good (tests/runtime/
    test_porting.py calls it): put back after each test, so a later test's stock reference runs stock's default."""
    before = diffusers_private.active_attention_backend()
    yield
    diffusers_private.make_active(before)


def generate(pipe, seed=0, **overrides):
    kwargs = dict(tiny.WAN_CALL, **overrides)
    return pipe(**kwargs, generator=torch.Generator().manual_seed(seed)).frames


def pil_array(videos) -> np.ndarray:
    """Stacked "pil" output: a list of videos (lists of frames) or a list of images."""
    if videos and not isinstance(videos[0], (list, tuple)):
        return np.stack([np.asarray(image) for image in videos]).astype(np.int16)
    return np.stack([np.stack([np.asarray(frame) for frame in video]) for video in videos]).astype(np.int16)


def stock_pil(frames):
    """Stock's "pil" output of a call whose "np" output is ``frames``, without running stock again: diffusers'
    ``numpy_to_pil`` (the step both outputs share up to the last: "pil" is "np" rounded to 8 bits), nested as the
    pipeline nests it (videos of frames, or images). test_postprocess checks it against stock's own "pil"."""
    from diffusers.image_processor import VaeImageProcessor

    frames = np.asarray(frames)
    if frames.ndim == 5:
        return [VaeImageProcessor.numpy_to_pil(video) for video in frames]
    return VaeImageProcessor.numpy_to_pil(frames)


def assert_np_matches(out, ref, atol=1e-4):
    out, ref = np.asarray(out), np.asarray(ref)
    assert out.shape == ref.shape and out.dtype == ref.dtype == np.float32
    assert np.isfinite(out).all()
    assert np.abs(out - ref).max() <= atol, f"max abs diff {np.abs(out - ref).max():.3g} > {atol}"


def assert_pil_matches(out, ref):
    """Stock rounding: equal except one level at .5 boundaries, on at most 0.1% of subpixels."""
    a, b = pil_array(out), pil_array(ref)
    assert a.shape == b.shape
    diff = np.abs(a - b)
    assert diff.max() <= 1, f"a subpixel differs by {diff.max()} levels"
    assert (diff > 0).mean() <= 1e-3, f"{(diff > 0).mean():.4%} of subpixels differ"


def all_equations(jaxpr):
    """Every equation of a jaxpr, descending into inner jaxprs (loops, cond branches, shard_map, pjit, Pallas)."""
    for eqn in jaxpr.eqns:
        yield eqn
        for value in eqn.params.values():
            for inner in value if isinstance(value, (tuple, list)) else (value,):
                inner = getattr(inner, "jaxpr", inner)
                if hasattr(inner, "eqns"):
                    yield from all_equations(inner)


def pytest_collection_modifyitems(config, items):
    """The 8-device mesh and the 2-process pod (minutes, in subprocesses) first: under ``pytest -n 2`` one worker
    runs them while the other takes the rest."""
    items.sort(key=lambda item: 0 if item.path.name == "test_mesh.py" else 1)


def run_fresh(code: str) -> dict:
    """``code`` in a fresh interpreter (no DIFFUSERS_TPU_ variables, this checkout first on the path): the JSON its
    last printed line holds. What a process has imported is then the thing under test."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {k: v for k, v in os.environ.items() if not k.startswith("DIFFUSERS_TPU_")}
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        cwd="/",
        env={**env, "PYTHONPATH": root},
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def compiled_method(pipe, module, method: str = "forward"):
    """The compiled method ``pipe.to`` installed for ``module.<method>`` (it holds ``programs``), found by name."""
    from diffusers_tpu.runtime.attach import pipeline_runtime

    return pipeline_runtime.runtime_of(pipe).compiled_of(module, method)
