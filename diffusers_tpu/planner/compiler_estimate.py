"""The TPU compiler's own run-time estimate of a compiled program, made whole: libtpu's
``cost_analysis()["optimal_seconds"]``.

What libtpu's number is (measured: BENCHMARKS.md, "The TPU compiler's own run-time estimate"): a per-op roofline of
the program's XLA ops (each op at the larger of its FLOPs at peak and its bytes at HBM speed; collectives as its cost
model counts them), with **each loop body counted once** and **Pallas kernels counted as nothing**. It is reported
only for programs of ops it models: a real-size step compiled at full effort holds ``ConcatBitcast`` custom calls of
the TPU compiler's own and gets a negative number (no estimate); the same step compiled at XLA's quick effort
(``plan``'s screening, the VAE's default build) gets one.

Made whole here, for a denoising step (``step``):
- **loops**: the step's repeated blocks are compiled unrolled at XLA's quick effort with every block list cut to one
  block, then with one list at two blocks (one program more per list): the differences are one block's seconds, the
  rest is everything around the blocks, and the step is the rest plus each list's blocks times its length. (Taking
  the once-counted loop body's share from the FLOPs and bytes instead came out 14% low for Wan2.1-14B 720p: the ops
  around the loop are many and small, and a per-op roofline charges each its own bound.)
- **the attention kernel**: the step's attention FLOPs (analytic, as padded; ``hlo_stats``) at ``attention_efficiency``
  of the chip's bf16 peak, the same assumption as ``step_estimate``. The rotary kernel is left out (elementwise, a
  few MB a layer).
The figure is of the quick-effort program's ops (the runtime builds the step at full effort, which libtpu does not
estimate): an estimate of the compiler's model, never a measurement.
"""

from __future__ import annotations

import contextlib
import dataclasses

import torch

from ..runtime.registry import family_of
from ..runtime.weights import block_signature
from . import plan, tpu_compiler
from .chips import Chip

COVERS = (
    "XLA's ops as the TPU compiler's per-op roofline of the quick-effort step, its blocks counted from 1- and 2-block "
    "programs; the attention kernel's FLOPs at {efficiency:.0%} of peak; the rotary kernel left out"
)


def reported(xla_cost: dict | None) -> float | None:
    """libtpu's ``optimal_seconds`` where it gave one (a negative number means none)."""
    seconds = (xla_cost or {}).get("optimal_seconds")
    return seconds if seconds is not None and seconds >= 0 else None


def attention_flops(passes: list[dict]) -> float:
    """The attention kernel's FLOPs per device of a step compiled as ``passes`` (its largest program)."""
    return max(step["hlo"]["total"]["attention_flops"] for step in passes)


@contextlib.contextmanager
def _blocks_cut(denoiser: torch.nn.Module, lengths: dict[str, int]):
    """``denoiser`` with each block list at ``path`` cut to its first ``lengths[path]`` blocks, restored after."""
    kept = {}
    try:
        for path, length in lengths.items():
            parent, _, name = path.rpartition(".")
            owner = denoiser.get_submodule(parent) if parent else denoiser
            kept[path] = (owner, name, getattr(owner, name))
            setattr(owner, name, torch.nn.ModuleList(list(kept[path][2])[:length]))
        yield
    finally:
        for owner, name, blocks in kept.values():
            setattr(owner, name, blocks)


def step(
    pipe,
    size: dict,
    config,
    devices,
    text_tokens: int,
    chip: Chip,
    attention_flops: float,
    attention_efficiency: float,
    calls: int = 1,
) -> dict | None:
    """The compiler's estimate of one denoising step (``calls`` runs of the step's program), from quick-effort
    programs of the step cut to 1 and 2 blocks per list (``len(lists) + 1`` compiles, seconds each) and the full
    step's ``attention_flops`` per device; None where libtpu gives no estimate."""
    denoiser = getattr(pipe, family_of(pipe).denoisers[0])
    lists = {path: len(blocks) for path, blocks in block_signature.block_lists(denoiser)}
    unrolled = dataclasses.replace(config, scan_blocks=False)

    def seconds(lengths: dict) -> float | None:
        with _blocks_cut(denoiser, lengths):
            report = plan.start_denoiser_memory(
                pipe, size, unrolled, devices, text_tokens, step_analyse=tpu_compiler.quick_figures
            )()
        return reported(report.get("xla_cost"))

    base = seconds(dict.fromkeys(lists, 1))
    if base is None:
        return None
    per_block = {}
    for path in lists:
        doubled = seconds({**dict.fromkeys(lists, 1), path: 2})
        if doubled is None:
            return None
        per_block[path] = doubled - base
    rest = base - sum(per_block.values())
    xla_ops = rest + sum(per_block[path] * length for path, length in lists.items())
    attention = attention_flops / (chip.peak_tflops * 1e12 * attention_efficiency)
    return {
        "seconds": calls * (xla_ops + attention),
        "xla_ops_seconds": calls * xla_ops,
        "attention_seconds": calls * attention,
        "per_block_seconds": per_block,
        "around_blocks_seconds": rest,
        "covers": COVERS.format(efficiency=attention_efficiency),
    }


def describe(found: dict | None) -> str:
    """One line for a report: the figure and what it covers, or why there is none."""
    if found is None:
        return "the TPU compiler's ESTIMATE: none (libtpu gave no figure for the step's quick-effort programs)"
    return (
        f"the TPU compiler's ESTIMATE {found['seconds']:.3g} s/step (XLA's ops {found['xla_ops_seconds']:.3g} s, "
        f"attention {found['attention_seconds']:.3g} s; {found['covers']})"
    )
