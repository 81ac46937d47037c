"""Seconds from a placed pipeline to "a real call compiles nothing", three ways, each in a fresh process with an empty
JAX compilation cache: ``warm_up(execute=True)`` (one real call per size), ``warm_up(execute=False)`` (the
zero-execution warm-up: programs compiled, nothing run but zeros) and a programs folder built ahead by another
process (``TPUConfig(programs=DIR)``: loaded, not compiled). After each, one real call of a warmed size: its
compilations (0 is the point) and its output against a compiling process's (bit-identical is the point).

    python benchmarks/ready_paths.py                      # tiny Wan (CPU figures: compiler seconds, never speed)
    python benchmarks/ready_paths.py --model wan-4head --height 32 --width 32 --frames 9 --steps 4

Figures in BENCHMARKS.md ("Time to ready").
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

CHILD = r"""
import json, os, sys, time
import numpy as np, torch
import diffusers_tpu
from diffusers_tpu import TPUConfig
from diffusers_tpu.interop import compile_accounting, jit
from diffusers_tpu.testing import tiny

mode, programs, size, steps, model, out_path = sys.argv[1:7]
size = json.loads(size)
config = TPUConfig(programs=programs) if mode in ("build", "load") else TPUConfig()
pipe = tiny.wan_pipeline(model).to("jax", config=config)
call = dict(prompt="a cat walks on the grass", negative_prompt="blurry", num_inference_steps=int(steps),
            output_type="np", **size)
start = time.perf_counter()
if mode in ("execute", "zero"):
    report = diffusers_tpu.warm_up(pipe, [size], execute=mode == "execute",
                                   **{k: v for k, v in call.items() if k not in size})
ready = time.perf_counter() - start
with compile_accounting.compile_log() as log:
    frames = pipe(**call, generator=torch.Generator().manual_seed(0)).frames
np.save(out_path, frames)
print(json.dumps(dict(mode=mode, ready_seconds=ready, call_compilations=log.compilations,
                      call_seconds=log.seconds)))
"""


def child(mode: str, programs: str, args, out_path: str) -> dict:
    size = json.dumps(dict(height=args.height, width=args.width, num_frames=args.frames))
    env = {**os.environ, "DIFFUSERS_TPU_CACHE_DIR": tempfile.mkdtemp(prefix="ready-cache-")}  # cold each time
    done = subprocess.run(
        [sys.executable, "-c", CHILD, mode, programs, size, str(args.steps), args.model, out_path],
        capture_output=True,
        text=True,
        env=env,
        timeout=3600,
    )
    if done.returncode != 0:
        raise SystemExit(f"{mode} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="wan")
    parser.add_argument("--height", type=int, default=32)
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--frames", type=int, default=9)
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args(argv)
    import numpy as np

    scratch = tempfile.mkdtemp(prefix="ready-paths-")
    programs = os.path.join(scratch, "programs")
    rows = {}
    for mode in ("cold", "execute", "zero", "build", "load"):  # build writes the folder that load reads
        rows[mode] = child(mode, programs, args, os.path.join(scratch, f"{mode}.npy"))
        print(json.dumps(rows[mode]), flush=True)
    reference = np.load(os.path.join(scratch, "cold.npy"))
    for mode, row in rows.items():
        row["identical_to_cold"] = bool(np.array_equal(np.load(os.path.join(scratch, f"{mode}.npy")), reference))
    print(
        "| path | seconds to ready | then a real call: compilations, their seconds | output = a compiling process's |"
    )
    print("|---|---:|---:|---|")
    names = {
        "cold": "none (the first call compiles)",
        "execute": "warm_up(execute=True)",
        "zero": "warm_up() (zero-execution)",
        "build": "programs=DIR, first process (compiles, writes)",
        "load": "programs=DIR, second process (loads)",
    }
    for mode, row in rows.items():
        ready = "—" if mode == "cold" else f"{row['ready_seconds']:.1f}"
        compiled = f"{row['call_compilations']}, {row['call_seconds']:.1f} s"
        print(f"| {names[mode]} | {ready} | {compiled} | {row['identical_to_cold']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
