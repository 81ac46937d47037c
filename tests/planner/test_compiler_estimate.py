"""The TPU compiler's own run-time estimate made whole (``planner.compiler_estimate``): libtpu counts a loop body once,
so the step's blocks are counted from programs cut to 1 and 2 blocks; checked against the whole step unrolled."""

import dataclasses

import pytest
import torch

from diffusers_tpu.commands.arguments import load_pipeline
from diffusers_tpu.planner import chips, compiler_estimate, plan, tpu_compiler
from diffusers_tpu.runtime.config import TPUConfig

needs_libtpu = pytest.mark.skipif(not tpu_compiler.available(), reason="libtpu (the TPU compiler) not installed")
SIZE = dict(height=64, width=64, num_frames=9, guidance_scale=5.0)


def test_libtpu_s_negative_figure_is_no_estimate():
    assert compiler_estimate.reported({"optimal_seconds": -0.99}) is None
    assert compiler_estimate.reported({}) is None
    assert compiler_estimate.reported({"optimal_seconds": 2e-3}) == 2e-3
    assert "none" in compiler_estimate.describe(None)


@needs_libtpu
def test_the_step_counted_from_cut_programs_equals_the_whole_step_unrolled():
    pipe = load_pipeline("tiny:wan-step")
    blocks = list(pipe.transformer.blocks)
    chip = chips.CHIPS["v6e-4"]
    devices = tpu_compiler.devices(chip)
    config = TPUConfig(dtype=torch.bfloat16, compile_cache_dir=False)
    found = compiler_estimate.step(pipe, SIZE, config, devices, 24, chip, attention_flops=0.0, attention_efficiency=0.5)
    assert list(pipe.transformer.blocks) == blocks  # the cut undone: the same blocks, in order

    def libtpu_says(scan: bool) -> float:
        report = plan.start_denoiser_memory(
            pipe,
            SIZE,
            dataclasses.replace(config, scan_blocks=scan),
            devices,
            24,
            step_analyse=tpu_compiler.quick_figures,
        )()
        return compiler_estimate.reported(report["xla_cost"])

    whole, once = libtpu_says(scan=False), libtpu_says(scan=True)
    assert found["xla_ops_seconds"] == pytest.approx(whole, rel=0.03)
    # what the correction is for: the scanned step's own figure counts its loop body once
    assert once < 0.5 * whole
    assert found["attention_seconds"] == 0 and found["seconds"] == found["xla_ops_seconds"]
    per_block = found["per_block_seconds"]["blocks"]
    assert per_block > 0 and found["around_blocks_seconds"] > 0
    assert found["xla_ops_seconds"] == pytest.approx(found["around_blocks_seconds"] + len(blocks) * per_block)
