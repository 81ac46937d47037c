"""Host work per denoising step on JAX: a tiny stock Wan pipeline's second call, on one device.

    python benchmarks/host_per_step.py                       # UniPC and FlowMatchEuler, and stock torch's step
    python benchmarks/host_per_step.py --scheduler unipc --steps 4 24

Each figure is the slope between a call of the fewer and a call of the more steps (both second calls: compiling and
the text encoder drop out). Every call of a compiled program (``jax.stages.Compiled``) is made to wait for its
results, so the time inside programs is measured apart from the rest: **host** = the wall-clock slope less the
programs' slope. Also counted: compiled calls per step, the programs JAX built during the first calls (its own count)
and during the second ones (0 expected). The host figures are of this machine's CPU (busy or not): a comparison
before/after on the same machine, never a TPU speed claim. Stock torch's whole step (CPU) is timed the same way.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import torch  # noqa: E402

import diffusers_tpu  # noqa: E402,F401
from diffusers_tpu.interop import compile_accounting  # noqa: E402
from diffusers_tpu.testing import tiny  # noqa: E402

CALL = dict(
    prompt="a cat walks on the grass",
    negative_prompt="blurry",
    height=16,
    width=16,
    num_frames=5,
    guidance_scale=5.0,
    output_type="latent",
)
# the tiny Wan: 1 layer, 2 heads of 8
TRANSFORMER = dict(tiny.WAN_TRANSFORMERS["wan"], num_layers=1, attention_head_dim=8)


def pipeline(scheduler: str):
    components = tiny.wan_components("wan", scheduler="unipc" if scheduler == "unipc" else "flow_match")
    torch.manual_seed(0)
    components["transformer"] = tiny.WanTransformer3DModel(**TRANSFORMER).eval()
    return tiny.WanPipeline(**components)


class _Spy:
    """Every compiled call waits for its results; counts them and the time inside."""

    def __init__(self):
        self.calls, self.seconds = 0, 0.0
        self.stock = jax.stages.Compiled.__call__
        spy = self

        def call(compiled, *args, **kwargs):
            start = time.perf_counter()
            out = spy.stock(compiled, *args, **kwargs)
            jax.block_until_ready(out)
            spy.seconds += time.perf_counter() - start
            spy.calls += 1
            return out

        jax.stages.Compiled.__call__ = call

    def measure(self, run):
        self.calls, self.seconds = 0, 0.0
        start = time.perf_counter()
        run()  # latents come back as a host tensor: the call has waited for its last program
        return time.perf_counter() - start, self.seconds, self.calls


def _call(pipe, steps):
    return pipe(**CALL, num_inference_steps=steps, generator=torch.Generator().manual_seed(0)).frames


def jax_figures(scheduler: str, steps: tuple[int, int], repeats: int) -> dict:
    pipe = pipeline(scheduler)
    pipe.to("jax")
    spy = _Spy()
    before = compile_accounting.process_programs().compilations
    for count in steps:
        _call(pipe, count)  # first calls: everything compiles
    first_programs = compile_accounting.process_programs().compilations - before
    slopes = {"wall": [], "xla": [], "calls": []}
    before = compile_accounting.process_programs().compilations
    for _ in range(repeats):
        (few_wall, few_xla, few_calls), (many_wall, many_xla, many_calls) = (
            spy.measure(lambda count=count: _call(pipe, count)) for count in steps
        )
        span = steps[1] - steps[0]
        slopes["wall"].append((many_wall - few_wall) / span)
        slopes["xla"].append((many_xla - few_xla) / span)
        slopes["calls"].append((many_calls - few_calls) / span)
    second_programs = compile_accounting.process_programs().compilations - before
    jax.stages.Compiled.__call__ = spy.stock
    wall, xla = statistics.median(slopes["wall"]), statistics.median(slopes["xla"])
    return {
        "scheduler": type(pipe.scheduler).__name__,
        "host_ms_per_step": round((wall - xla) * 1e3, 2),
        "xla_ms_per_step": round(xla * 1e3, 2),
        "compiled_calls_per_step": statistics.median(slopes["calls"]),
        "first_call_programs": first_programs,
        "second_call_programs": second_programs,
    }


def torch_figures(scheduler: str, steps: tuple[int, int], repeats: int) -> dict:
    pipe = pipeline(scheduler)
    for count in steps:
        _call(pipe, count)
    slopes = []
    for _ in range(repeats):
        few, many = [], []
        for count, into in zip(steps, (few, many)):
            start = time.perf_counter()
            _call(pipe, count)
            into.append(time.perf_counter() - start)
        slopes.append((many[0] - few[0]) / (steps[1] - steps[0]))
    return {"scheduler": type(pipe.scheduler).__name__, "torch_ms_per_step": round(statistics.median(slopes) * 1e3, 2)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/host_per_step.py")
    parser.add_argument("--scheduler", choices=("unipc", "flow_match"), action="append")
    parser.add_argument("--steps", type=int, nargs=2, default=(4, 24))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-torch", action="store_true", help="skip stock torch's step")
    parser.add_argument("--isolate", action="store_true", help=argparse.SUPPRESS)  # the one process of a row
    args = parser.parse_args(argv)
    schedulers = args.scheduler or ("unipc", "flow_match")
    if len(schedulers) > 1 and not args.isolate:  # a process each: a first call's programs are its own
        for scheduler in schedulers:
            rest = [a for a in (argv or sys.argv[1:]) if a not in schedulers and a != "--scheduler"]
            subprocess.run([sys.executable, __file__, "--scheduler", scheduler, "--isolate", *rest], check=True)
        return 0
    row = jax_figures(schedulers[0], tuple(args.steps), args.repeats)
    if not args.no_torch:
        row.update(torch_figures(schedulers[0], tuple(args.steps), args.repeats))
    print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
