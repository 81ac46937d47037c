"""How long a new process waits before its first denoising step computes: cold, then with JAX's persistent
compilation cache warm (what a restarted service pays). Figures in BENCHMARKS.md.

    python benchmarks/load_memory.py write DIR --arch Wan2.1-1.3B   # real-size denoiser, random weights
    python benchmarks/first_step.py DIR --height 480 --width 832 --frames 81

The same child runs twice, each a fresh process sharing one new cache folder. A child imports, loads the
checkpoint onto the devices (``diffusers_tpu.from_pretrained``, bfloat16), calls the pipeline, and stops the moment
the denoiser's first call returns: its program compiled (or loaded) and its execution dispatched — JAX dispatches
asynchronously, so what is measured is the wait before the step computes, not the step. The checkpoint's text
encoder and VAE are the tiny test ones (``load_memory write``): the call passes text embeddings of the real shape
(512 tokens), and the first step needs only the denoiser's program.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import jax
import torch

import diffusers_tpu
from diffusers_tpu.interop import compile_accounting
from diffusers_tpu.runtime.files import outputs

# ``-m`` imports the package (torch, JAX, diffusers) before this module runs: the first phase includes it
PHASES = ("python start and imports", "load onto devices", "call to first step dispatched")


def child(folder: str, height: int, width: int, frames: int, device: str, scan_blocks: bool = True) -> dict:

    marks = {"started": time.time()}
    pipe = diffusers_tpu.from_pretrained(
        folder, device=device, dtype=torch.bfloat16, config=diffusers_tpu.TPUConfig(scan_blocks=scan_blocks)
    )
    marks["placed"] = time.time()
    stock = pipe.transformer.forward

    def first_call(*args, **kwargs):
        out = stock(*args, **kwargs)
        marks["dispatched"] = time.time()
        report = dict(
            marks, programs=log.compilations, cache_hits=log.cache_hits, compile_seconds=round(log.seconds, 2)
        )
        print("RESULT " + json.dumps(report), flush=True)
        os._exit(0)  # the step's execution is not what is measured
        return out

    pipe.transformer.forward = first_call
    # the tiny text encoder's width is not the real denoiser's: text embeddings of the real shape instead
    text = torch.zeros(1, 512, pipe.transformer.config.text_dim, dtype=torch.bfloat16)
    with compile_accounting.compile_log() as log:
        pipe(
            prompt_embeds=text,
            negative_prompt_embeds=text,
            height=height,
            width=width,
            num_frames=frames,
            num_inference_steps=2,
            output_type="latent",
            generator=torch.Generator().manual_seed(0),
        )
    raise RuntimeError("the pipeline finished without calling its transformer")


def measure(
    folder: str, height: int, width: int, frames: int, device: str, cache_dir: str, scan_blocks: bool = True
) -> list[dict]:
    runs = []
    for label in ("cold cache", "warm cache"):
        env = dict(os.environ, DIFFUSERS_TPU_CACHE_DIR=cache_dir)
        spawned = time.time()
        result = subprocess.run(
            [
                sys.executable,
                __file__,
                folder,
                "--child",
                "--height",
                str(height),
                "--width",
                str(width),
                "--frames",
                str(frames),
                "--device",
                device,
            ]
            + ([] if scan_blocks else ["--unrolled"]),
            env=env,
            capture_output=True,
            text=True,
        )
        lines = [line for line in result.stdout.splitlines() if line.startswith("RESULT ")]
        if not lines:
            raise RuntimeError(f"the {label} child failed:\n{result.stderr[-3000:]}")
        marks = json.loads(lines[-1][len("RESULT ") :])
        seconds = [
            marks["started"] - spawned,
            marks["placed"] - marks["started"],
            marks["dispatched"] - marks["placed"],
        ]
        runs.append(
            dict(
                run=label,
                phases=dict(zip(PHASES, (round(s, 2) for s in seconds))),
                to_first_step_s=round(marks["dispatched"] - spawned, 2),
                programs=marks["programs"],
                cache_hits=marks["cache_hits"],
                compile_seconds=marks["compile_seconds"],
            )
        )
    return runs


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/first_step.py")
    parser.add_argument("folder", help="a pipeline folder (python benchmarks/load_memory.py write DIR)")
    parser.add_argument("--height", type=int, default=480)
    parser.add_argument("--width", type=int, default=832)
    parser.add_argument("--frames", type=int, default=81)
    parser.add_argument("--device", default="jax", help="'jax' (JAX's default platform) or 'tpu'")
    parser.add_argument("--cache-dir", help="the compilation cache to use (default: a new empty folder)")
    parser.add_argument(
        "--unrolled",
        action="store_true",
        help="TPUConfig(scan_blocks=False): every block its own copy in the program (the old way)",
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--json", help="write the two runs to this file")
    args = parser.parse_args(argv)
    if args.child:
        child(args.folder, args.height, args.width, args.frames, args.device, not args.unrolled)
        return 1
    if args.json:
        outputs.check_destination(args.json, what="--json")  # before minutes of compiling
    with tempfile.TemporaryDirectory() as fresh:
        runs = measure(
            args.folder, args.height, args.width, args.frames, args.device, args.cache_dir or fresh, not args.unrolled
        )

    for run in runs:
        print(
            f"{run['run']}: first step after {run['to_first_step_s']:.1f} s ({run['phases']}); "
            f"{run['programs']} programs, {run['cache_hits']} from the cache, {run['compile_seconds']:.1f} s "
            f"tracing + compiling; {jax.default_backend()}",
            flush=True,
        )
    if args.json:
        outputs.write_text(args.json, json.dumps(runs, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
