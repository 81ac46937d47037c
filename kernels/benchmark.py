"""Time the attention kernels on whatever JAX platform this runs on.

    python -m diffusers_tpu.kernels.benchmark --heads 40 --q-len 75600 --kv-len 75600 --dtype bfloat16

Each kernel is jitted, warmed up, then timed ``--repeats`` times after ``block_until_ready``; the median is
reported with the platform. Off TPU the Pallas kernels run in interpret mode: those numbers say nothing about
TPU speed and are marked so.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import torch

from . import BlockSizes, cudnn_attention, flash_attention, reference_attention, splash_attention

PALLAS = ("splash_exp2", "splash")
REFERENCE_SCORE_BYTES = 8 * 2**30


def kernels_for(platform: str) -> dict:
    available = {"splash_exp2": flash_attention, "splash": splash_attention, "xla": reference_attention}
    if platform == "gpu":  # TPU Pallas kernels would run interpreted there: compare what a GPU user runs
        available = {"cudnn": cudnn_attention, "xla": reference_attention}
    return available


def _time(call, wait, repeats: int, warmup: int) -> dict:
    """First call (compiles), ``warmup - 1`` more, then the median of ``repeats``, each ended by ``wait``."""
    start = time.perf_counter()
    wait(call())
    first = time.perf_counter() - start
    for _ in range(warmup - 1):
        wait(call())
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        wait(call())
        times.append(time.perf_counter() - start)
    return {"first_call_s": first, "median_s": statistics.median(times), "min_s": min(times), "runs": repeats}


def time_kernel(fn, args, repeats: int, warmup: int) -> dict:
    jitted = jax.jit(fn)
    return _time(lambda: jitted(*args), jax.block_until_ready, repeats, warmup)


def time_torch_sdpa(q, k, v, repeats: int, warmup: int) -> tuple[dict, np.ndarray]:
    """torch's own ``scaled_dot_product_attention`` (its default backend choice) on the same inputs, CUDA when
    present: the kernel stock diffusers runs."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    tq, tk, tv = (
        torch.from_numpy(np.asarray(x.astype(jnp.float32))).to(device, getattr(torch, str(x.dtype))) for x in (q, k, v)
    )
    wait = (lambda _: torch.cuda.synchronize()) if device == "cuda" else (lambda _: None)
    call = lambda: torch.nn.functional.scaled_dot_product_attention(tq, tk, tv)  # noqa: E731
    with torch.inference_mode():
        entry = dict(_time(call, wait, repeats, warmup), device=device)
        out = call()
    return entry, out.float().cpu().numpy()


def run(
    batch=1,
    heads=4,
    q_len=1024,
    kv_len=1024,
    head_dim=64,
    dtype="float32",
    repeats=5,
    warmup=2,
    kernels=None,
    block_sizes: BlockSizes | None = None,
    torch_sdpa: bool = False,
) -> dict:
    platform = jax.default_backend()
    rng = np.random.default_rng(0)
    jdtype = jnp.dtype(dtype)
    q = jnp.asarray(rng.standard_normal((batch, heads, q_len, head_dim)), jdtype)
    k = jnp.asarray(rng.standard_normal((batch, heads, kv_len, head_dim)), jdtype)
    v = jnp.asarray(rng.standard_normal((batch, heads, kv_len, head_dim)), jdtype)
    chosen = kernels_for(platform)
    if kernels:
        unknown = set(kernels) - set(chosen)
        if unknown:
            raise ValueError(
                f"kernels {sorted(unknown)} are not benchmarked on {platform}; choose from {sorted(chosen)}"
            )
        chosen = {name: chosen[name] for name in kernels}
    # the reference materialises float32 scores: past a few GB (long self-attention) it is not computed and
    # kernels are compared with each other instead (the first timed kernel is the yardstick)
    fits = batch * heads * q_len * kv_len * 4 <= REFERENCE_SCORE_BYTES
    reference = np.asarray(jax.jit(reference_attention)(q, k, v), np.float32) if fits else None
    if not fits:
        chosen.pop("xla", None)
    results = {}
    for name, kernel in chosen.items():
        options = {"block_sizes": block_sizes} if name == "splash_exp2" and block_sizes else {}
        fn = lambda q, k, v, _kernel=kernel, _options=options: _kernel(q, k, v, **_options)  # noqa: E731
        entry = time_kernel(fn, (q, k, v), repeats, warmup)
        out = np.asarray(jax.jit(fn)(q, k, v), np.float32)
        reference = out if reference is None else reference
        entry["max_abs_diff_vs_xla"] = float(np.abs(out - reference).max()) if fits else None
        entry["interpret_mode"] = name in PALLAS and platform != "tpu"
        results[name] = entry
    if torch_sdpa:
        entry, out = time_torch_sdpa(q, k, v, repeats, warmup)
        entry["max_abs_diff_vs_xla"] = float(np.abs(out - reference).max()) if fits else None
        entry["max_abs_diff_vs_first"] = float(np.abs(out - reference).max())
        entry["interpret_mode"] = False
        results["torch_sdpa"] = entry
    flops = 4 * batch * heads * q_len * kv_len * head_dim
    return {
        "platform": platform,
        "device": str(jax.devices()[0].device_kind),
        "jax": jax.__version__,
        "shape": dict(batch=batch, heads=heads, q_len=q_len, kv_len=kv_len, head_dim=head_dim, dtype=dtype),
        "flop_per_call": flops,
        "speed_claim": platform == "tpu" or platform == "gpu",
        "kernels": results,
    }


def format_table(report: dict) -> str:
    shape = report["shape"]
    lines = [
        f"attention {shape} on {report['platform']} ({report['device']}), jax {report['jax']}",
        f"{'kernel':<12} {'median ms':>10} {'TFLOP/s':>9} {'first call s':>13} {'max |diff|':>11}",
    ]
    for name, entry in report["kernels"].items():
        tflops = report["flop_per_call"] / entry["median_s"] / 1e12
        note = "  (interpret mode: not a speed claim)" if entry["interpret_mode"] else ""
        lines.append(
            f"{name:<12} {entry['median_s'] * 1e3:>10.2f} {tflops:>9.3f} {entry['first_call_s']:>13.2f} "
            + (f"{entry['max_abs_diff_vs_xla']:>11.2e}" if entry["max_abs_diff_vs_xla"] is not None else f"{'n/a':>11}")
            + note
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m diffusers_tpu.kernels.benchmark",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--q-len", type=int, default=1024)
    parser.add_argument("--kv-len", type=int, default=1024)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--kernels", nargs="+", help="subset of kernels to time")
    parser.add_argument(
        "--torch",
        action="store_true",
        help="also time torch's scaled_dot_product_attention (CUDA when present) on the same inputs",
    )
    parser.add_argument("--json", help="also write the report to this file")
    args = parser.parse_args(argv)
    report = run(
        args.batch,
        args.heads,
        args.q_len,
        args.kv_len,
        args.head_dim,
        args.dtype,
        args.repeats,
        args.warmup,
        args.kernels,
        torch_sdpa=args.torch,
    )
    print(format_table(report))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(report, handle, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
