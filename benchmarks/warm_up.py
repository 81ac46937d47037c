"""What ``diffusers_tpu.warm_up`` costs beside what it saves, each way in a fresh process (no program in memory, an
empty compilation cache): ``cold`` (real calls, no warm-up), ``zero`` (the zero-execution warm-up, then the calls),
``execute`` (``warm_up(..., execute=True)``, then the calls). Figures in BENCHMARKS.md.

    python benchmarks/warm_up.py [--layers 6 --heads 8 --head-dim 32] [--steps 20] [--runs 3] [--json FILE]

A Wan built from the tiny test components with a transformer of the given size, UniPC, guidance 5, served at two
sizes (256x256x17 and 32x48x13 by default). The compile time a warm-up saves a real call is the cold calls' time
minus the same calls' time once warm; the zero-execution warm-up should take about that (``warm_up_s`` beside
``saved_s``; also beside ``execute.saved_s``: an executing warm-up's time less the same calls' time once warm),
build the same programs (``warm_up_programs`` beside ``cold_programs``), and leave the calls after it compiling
nothing. Medians of ``--runs`` processes per way. CPU figures are not speed claims: only the ratio means anything.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

SIZES = [dict(height=256, width=256, num_frames=17), dict(height=32, width=48, num_frames=13)]


def child(way: str, layers: int, heads: int, head_dim: int, steps: int) -> dict:
    import jax

    built = {"programs": 0}

    def count(event: str, duration: float, **_) -> None:
        built["programs"] += event == "/jax/core/compile/backend_compile_duration"

    jax.monitoring.register_event_duration_secs_listener(count)
    import diffusers
    import torch

    import diffusers_tpu
    from diffusers_tpu.testing import tiny

    components = tiny.wan_components("wan-4head", scheduler="unipc")
    torch.manual_seed(0)
    config = dict(
        tiny.WAN_TRANSFORMERS["wan-4head"],
        num_attention_heads=heads,
        attention_head_dim=head_dim,
        num_layers=layers,
        ffn_dim=4 * heads * head_dim,
    )
    components["transformer"] = diffusers.WanTransformer3DModel(**config).eval()
    pipe = diffusers.WanPipeline(**components)
    pipe.set_progress_bar_config(disable=True)
    pipe.to("jax")
    call = dict(
        prompt="a cat", negative_prompt="blurry", guidance_scale=5.0, num_inference_steps=steps, output_type="np"
    )
    report = {}
    if way != "cold":
        start, before = time.perf_counter(), built["programs"]
        diffusers_tpu.warm_up(pipe, SIZES, execute=way == "execute", **call)
        report.update(warm_up_s=time.perf_counter() - start, warm_up_programs=built["programs"] - before)
    for name in ("first", "again"):  # the served calls, then the same calls once more (warm: no compile at all)
        start, before = time.perf_counter(), built["programs"]
        for size in SIZES:
            pipe(**call, **size, generator=torch.Generator().manual_seed(1))
        report[f"{name}_calls_s"] = time.perf_counter() - start
        report[f"{name}_calls_programs"] = built["programs"] - before
    return report


def _run(way: str, args) -> dict:
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, DIFFUSERS_TPU_CACHE_DIR=cache)
        command = [sys.executable, __file__, "--child", way, "--layers", str(args.layers), "--heads", str(args.heads)]
        command += ["--head-dim", str(args.head_dim), "--steps", str(args.steps)]
        result = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"the {way} child failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/warm_up.py")
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=32)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.layers, args.heads, args.head_dim, args.steps)))
        return 0
    runs = {way: [_run(way, args) for _ in range(args.runs)] for way in ("cold", "zero", "execute")}

    def median(way, key):
        return statistics.median(run[key] for run in runs[way])

    saved = median("cold", "first_calls_s") - median("cold", "again_calls_s")
    report = dict(
        saved_s=round(saved, 2),
        cold_programs=median("cold", "first_calls_programs"),
        zero=dict(
            warm_up_s=round(median("zero", "warm_up_s"), 2),
            warm_up_programs=median("zero", "warm_up_programs"),
            calls_after_programs=max(run["first_calls_programs"] for run in runs["zero"]),
        ),
        execute=dict(
            warm_up_s=round(median("execute", "warm_up_s"), 2),
            warm_up_programs=median("execute", "warm_up_programs"),
            calls_after_programs=max(run["first_calls_programs"] for run in runs["execute"]),
        ),
        runs=runs,
    )
    report["zero"]["warm_up_over_saved"] = round(report["zero"]["warm_up_s"] / saved, 3) if saved > 0 else None
    # the same saving measured the other way: an executing warm-up's time less the same calls' time once warm
    executed = median("execute", "warm_up_s") - median("execute", "again_calls_s")
    report["execute"]["saved_s"] = round(executed, 2)
    report["zero"]["warm_up_over_execute_saved"] = round(report["zero"]["warm_up_s"] / executed, 3)
    print(json.dumps({k: v for k, v in report.items() if k != "runs"}, indent=1))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(report, handle, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
