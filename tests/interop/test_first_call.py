"""A first call compiles few programs: every eager op on the devices is a program of its own (compiled once per
process), so glue that stock runs around the models (prompt trimming and padding, RoPE tables, the schedule's scalars
and vectors) runs on the host instead. Counts from a cold process (tests/workers/first_call_worker.py), the families
one after another."""

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # cold processes, minutes in all: CI's second command (setup.cfg)

# Programs per first call, measured 2026-11-24 in one process, in the worker's order (later families reuse earlier
# ones' eager programs of the same shapes). Before host-side glue: 52, 135, 41, 46, 25; cold, one process per family,
# 52, 141, 53, 67, 38 -> now 20, 19, 16, 28, 18 (BENCHMARKS.md "First call"). A count above its figure is a
# regression: find the new eager op (jax_log_compiles) and move it to the host or into a compiled program.

# cogvideox 15: every step of its DPM scheduler compiled (each step after the first reads ``timesteps[i - 1]``; they
# ran stock's op-by-op step before, and the trace finding the draws ran its arithmetic op by op: 19 then).
BUDGET = {"wan": 20, "cogvideox": 15, "hunyuanvideo15": 15, "ltx": 26, "flux": 17}


def test_first_call_program_counts():
    worker = os.path.join(os.path.dirname(os.path.dirname(__file__)), "workers", "first_call_worker.py")
    result = subprocess.run(
        [sys.executable, worker],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    counts = json.loads(result.stdout.strip().splitlines()[-1])
    assert set(counts) == set(BUDGET)
    over = {
        name: (counts[name]["programs"], BUDGET[name]) for name in BUDGET if counts[name]["programs"] > BUDGET[name]
    }
    assert not over, f"first calls compile more programs than before (count, budget): {over}"
    assert sum(c["programs"] for c in counts.values()) <= 0.5 * (52 + 135 + 41 + 46 + 25)  # at least halved


@pytest.mark.parametrize("name", ["wan", "cogvideox"])
def test_the_project_counts_every_program_jax_builds_and_a_first_call_stays_under_30(tmp_path, name):
    """JAX's own backend-compile events over a whole cold process (start-up, ``pipe.to``, the first call: a tiny Wan
    with UniPC, guidance, 3 steps, 13 frames at 32x48, prompts padded to 20 tokens) equal ``stats(pipe)``'s
    process count. Measured 2026-12-02 before: Wan 38 (2 at start-up seeding torchax's key, 8 stacking the blocks'
    weights at ``pipe.to``, 28 in the call, of which the project reported only the 28), CogVideoX 32; now 27 and 20."""
    worker = os.path.join(os.path.dirname(os.path.dirname(__file__)), "workers", "program_count_worker.py")
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "DIFFUSERS_TPU_CACHE_DIR": str(tmp_path)}
    result = subprocess.run([sys.executable, worker, name], capture_output=True, text=True, timeout=600, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    counts = json.loads(result.stdout.strip().splitlines()[-1])
    assert counts["project"] == counts["jax"], counts
    assert counts["jax"] == counts["call"] + counts["placing"], counts  # nothing at start-up
    assert counts["placing"] == 0 and counts["jax"] <= 30, counts
    assert counts["second_jax"] == counts["second_project"] == 0, counts  # no work moved into a later call


def test_a_second_process_loads_every_program_from_the_persistent_cache(tmp_path):
    """JAX caches only programs slower than 1 s to compile by default; the runtime lowers that to 0 for its cache, so
    a restarted service loads its small glue programs too instead of compiling them again (3 of Wan's 20 before)."""
    worker = os.path.join(os.path.dirname(os.path.dirname(__file__)), "workers", "first_call_worker.py")
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "DIFFUSERS_TPU_CACHE_DIR": str(tmp_path)}
    env.pop("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", None)  # the suite's own setting (conftest): JAX's default
    runs = []
    for _ in range(2):
        result = subprocess.run([sys.executable, worker, "wan"], capture_output=True, text=True, timeout=600, env=env)
        assert result.returncode == 0, result.stderr[-3000:]
        runs.append(json.loads(result.stdout.strip().splitlines()[-1])["wan"])
    cold, warm = runs
    assert cold["cache_hits"] == 0 and cold["programs"] > 0
    assert warm["programs"] == cold["programs"] and warm["cache_hits"] == warm["programs"], runs


def test_first_step_measures_a_cold_and_a_warm_process(tmp_path):
    """``python benchmarks/first_step.py``: two fresh processes on one new cache; the second loads the
    denoiser's program instead of compiling it, and both stop at the first step's dispatch."""
    from benchmarks import first_step
    from diffusers_tpu.testing import tiny

    folder = tiny.save_wan_pipeline(tmp_path / "wan")
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", None)
    result = subprocess.run(
        [
            sys.executable,
            first_step.__file__,
            folder,
            "--height",
            "32",
            "--width",
            "32",
            "--frames",
            "9",
            "--cache-dir",
            str(tmp_path / "cache"),
            "--json",
            str(tmp_path / "runs.json"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    cold, warm = json.loads((tmp_path / "runs.json").read_text())
    assert cold["cache_hits"] == 0 and cold["programs"] > 0
    assert warm["cache_hits"] == warm["programs"] == cold["programs"]
    for run in (cold, warm):
        assert list(run["phases"]) == list(first_step.PHASES) and all(s >= 0 for s in run["phases"].values())
        assert run["to_first_step_s"] >= sum(run["phases"].values()) - 0.05


@pytest.mark.parametrize("execute", [False, True], ids=["zero-execution", "executing"])
def test_warm_up_compiles_ahead_for_the_served_sizes(execute):
    """``diffusers_tpu.warm_up``: after it, a request of a warmed size and step count compiles nothing (another
    prompt and seed; a multistep scheduler: UniPC) and gives what a pipeline warmed by nothing gives; another size
    still compiles (the count is real). By default no program runs during it: zeros stand for their outputs."""
    import jax
    import numpy as np
    import torch

    import diffusers_tpu
    from diffusers_tpu.interop import compile_accounting
    from diffusers_tpu.testing import tiny

    pipe = tiny.wan_pipeline("wan", scheduler="unipc")
    served = dict(negative_prompt="blurry", output_type="np", num_inference_steps=4)
    with pytest.raises(ValueError, match=r"pipe.to\('tpu'\)"):
        diffusers_tpu.warm_up(pipe, [dict(height=32, width=32, num_frames=9)], prompt="a cat", **served)
    request = dict(served, prompt="a red fox jumps over a sleeping dog", height=32, width=32, num_frames=9)
    unwarmed = tiny.wan_pipeline("wan", scheduler="unipc").to("jax")
    expected = unwarmed(**request, generator=torch.Generator().manual_seed(1)).frames
    unwarmed.to("cpu")
    pipe.to("jax")
    runs, call = [], jax.stages.Compiled.__call__
    jax.stages.Compiled.__call__ = lambda self, *a, **k: runs.append(self) or call(self, *a, **k)
    try:
        warmed = diffusers_tpu.warm_up(
            pipe, [dict(height=32, width=32, num_frames=9)], execute=execute, prompt="a cat", **served
        )
    finally:
        jax.stages.Compiled.__call__ = call
    assert warmed["programs"] > 0
    assert bool(runs) == execute  # zero-execution: the programs were built and never run
    with compile_accounting.compile_log() as log:
        frames = pipe(**request, generator=torch.Generator().manual_seed(1)).frames
    assert log.compilations == 0 and frames.shape == (1, 9, 32, 32, 3)
    assert np.array_equal(frames, expected)  # the walk left nothing behind (scheduler state, caches)
    with compile_accounting.compile_log() as log:
        pipe(**served, prompt="a cat", height=32, width=48, num_frames=9)
    assert log.compilations > 0
