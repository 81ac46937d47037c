"""Wan's wider family on JAX (video-to-video, VACE, SkyReels-V2 and its diffusion forcing) against stock torch."""

import numpy as np
import pytest
import torch
from conftest import assert_np_matches, assert_pil_matches

import diffusers_tpu
from diffusers_tpu import compile as jit
from diffusers_tpu import tiny_families

STEPS = {"wan-v2v": 2, "wan-vace": 2, "skyreels-v2": 2, "skyreels-v2-df": 4}  # denoiser calls per CFG side


def run(pipe, call, **overrides):
    return pipe(**dict(call, **overrides), generator=torch.Generator().manual_seed(0)).frames


@pytest.mark.parametrize("name", list(STEPS))
def test_matches_stock_with_the_cfg_pair_batched(name):
    ref, call = tiny_families.pipeline(name)
    expected, expected_pil = run(ref, call, output_type="np"), run(ref, call, output_type="pil")
    pipe, _ = tiny_families.pipeline(name)
    pipe.to("jax", config=diffusers_tpu.TPUConfig(batch_cfg=True))
    runtime = pipe._diffusers_tpu_runtime
    assert runtime.family.name == "wan"  # first-class: Wan's sharding table and CFG pairing
    assert_np_matches(run(pipe, call, output_type="np"), expected)
    assert runtime.pairing.batched_steps == STEPS[name]  # every step ran cond and uncond as one batch
    assert_pil_matches(run(pipe, call, output_type="pil"), expected_pil)
    with jit.compile_log() as log:
        run(pipe, call, output_type="np")
    assert log.compilations == 0
    assert np.isfinite(expected).all() and np.asarray(expected).std() > 1e-3  # a real video, not a constant
