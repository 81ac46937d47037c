"""Issue 14's first-class families on JAX against stock torch on one device: Wan's wider family, LTX-Video,
HunyuanVideo 1.0, Flux, Qwen-Image and Z-Image (tiny offline configs: 2+ layers, prompts of different lengths)."""

import copy

import numpy as np
import pytest
import torch

import diffusers_tpu
from diffusers_tpu.interop import jit
from diffusers_tpu.testing import tiny_families, tiny_images
from tests.conftest import assert_np_matches, assert_pil_matches, stock_pil

# name -> (family, denoiser calls per CFG side batched over dp, or None when the pipeline batches CFG itself)
CASES = {
    "wan-v2v": ("wan", 2),
    "wan-vace": ("wan", 2),
    "skyreels-v2": ("wan", 2),
    "skyreels-v2-df": ("wan", 4),
    "ltx": ("ltx", None),
    "ltx-i2v": ("ltx", None),
    "hunyuan-video": ("hunyuanvideo", 2),
    "hunyuanvideo15-i2v": ("hunyuanvideo15", 2),
    "ltx2": ("ltx2", None),
    "ltx2-i2v": ("ltx2", None),
    "wan-animate": ("generic", None),  # generic path: its uncond face input is made inside the loop
    "flux": ("flux", 2),
    "qwen-image": ("qwenimage", 2),
    "z-image": ("zimage", None),
}


def build(name):
    return (tiny_images if name in tiny_images.PIPELINES else tiny_families).pipeline(name)


def run(pipe, call, output_type, audio=None):
    out = pipe(**copy.deepcopy(call), output_type=output_type, generator=torch.Generator().manual_seed(0))
    if audio is not None and hasattr(out, "audio"):  # LTX-2: the soundtrack too, as host tensors
        audio.append(out.audio)
    return out.images if hasattr(out, "images") else out.frames


@pytest.mark.parametrize("name", list(CASES))
def test_matches_stock_torch(name):
    family, batched = CASES[name]
    ref, call = build(name)
    sound = []
    expected = run(ref, call, "np", sound)
    expected_pil = stock_pil(expected)
    assert np.isfinite(expected).all() and np.asarray(expected).std() > 1e-3  # a real picture, not a constant
    pipe, _ = build(name)
    pipe.to("jax", config=diffusers_tpu.TPUConfig(batch_cfg=True))  # pair CFG on one device too
    runtime = pipe._diffusers_tpu_runtime
    assert runtime.family.name == family
    assert_np_matches(run(pipe, call, "np", sound), expected)
    if sound:
        assert type(sound[1]) is torch.Tensor and sound[1].device.type == "cpu"
        assert sound[0].abs().max() > 1e-3 and torch.allclose(sound[1], sound[0], atol=1e-4, rtol=0)
    if batched is None:
        assert runtime.pairing is None
    else:
        assert runtime.pairing.batched_steps == batched  # every step ran cond and uncond as one batch
    assert_pil_matches(run(pipe, call, "pil"), expected_pil)
    with jit.compile_log() as log:
        run(pipe, call, "np")
    assert log.compilations == 0
