"""UNet pipelines on JAX (``families/unet.py``): Stable Diffusion 1.5 and its img2img / inpaint / ControlNet
pipelines, SDXL, Stable Video Diffusion and AnimateDiff give stock diffusers' images and videos (the 8-device mesh:
``mesh_worker.py families``)."""

import copy
import logging
import re

import diffusers
import jax.numpy as jnp
import numpy as np
import torch

import diffusers_tpu
from diffusers_tpu.families import unet as unet_family
from diffusers_tpu.runtime.attention import sdpa
from diffusers_tpu.testing import tiny_unet
from tests.conftest import assert_np_matches


def run(pipe, call, output_type, flags=None):
    out = pipe(**copy.deepcopy(call), output_type=output_type, generator=torch.Generator().manual_seed(0))
    if flags is not None:  # Stable Diffusion's safety checker's verdicts
        flags.append(getattr(out, "nsfw_content_detected", None))
    return out.frames if hasattr(out, "frames") else out.images


def test_an_unverified_unet_pipeline_runs_with_a_warning_and_matches_stock(caplog):
    """A UNet pipeline no recipe compares (score-SDE VE: an unconditional UNet2DModel with self-attention and a
    predictor-corrector sampler) takes the UNet path, says it is unverified, and still gives stock's images."""
    caplog.set_level(logging.WARNING, logger="diffusers_tpu")

    def score_sde():
        torch.manual_seed(0)
        model = diffusers.UNet2DModel(
            sample_size=8,
            in_channels=3,
            out_channels=3,
            block_out_channels=(8, 8),
            down_block_types=("DownBlock2D", "AttnDownBlock2D"),
            up_block_types=("AttnUpBlock2D", "UpBlock2D"),
            norm_num_groups=4,
            layers_per_block=2,
            attention_head_dim=2,
        )
        return diffusers.ScoreSdeVePipeline(unet=model.eval(), scheduler=diffusers.ScoreSdeVeScheduler())

    call = dict(num_inference_steps=3, batch_size=2)
    expected = run(score_sde(), call, "np")
    assert diffusers_tpu.supported_pipelines()["ScoreSdeVePipeline"].startswith("untested: runs on the unet path")
    pipe = score_sde().to("jax")
    assert (
        "ScoreSdeVePipeline runs on the unet path; no tiny recipe in the parity sweep: its output has not been "
        "compared with stock" in caplog.text
    )
    assert_np_matches(run(pipe, call, "np"), expected)


def test_unet_sharding_follows_heads_and_blocks():
    """tp splits whole heads of every attention (cross, self and the motion modules'); block inputs split the batch
    over dp, the spatial transformers' tokens over sp."""
    pipe, _ = tiny_unet.pipeline("animatediff")
    rules = dict(unet_family.UNET.rules(pipe.unet, {"dp": 2, "sp": 1, "tp": 4}))
    cross = "down_blocks\\.0\\.attentions\\.0\\.transformer_blocks\\.0\\.attn2\\.to_q\\.weight"
    motion = "down_blocks\\.0\\.motion_modules\\.0\\.transformer_blocks\\.0\\.attn1\\.to_out\\.0\\.weight"
    assert rules[f"^{cross}$"] == ("tp", None) and rules[f"^{motion}$"] == (None, "tp")
    assert not any("conv" in pattern for pattern in rules)  # convolutions stay replicated
    assert unet_family.num_heads(pipe) == 4
    matched = {
        name
        for name, _ in pipe.unet.named_modules()
        for pattern, _ in unet_family.UNET.activation_rules
        if re.search(pattern, name)
    }
    assert {"down_blocks.0", "mid_block", "up_blocks.1"} <= matched
    assert "down_blocks.0.attentions.0.transformer_blocks.0" in matched
    assert not any("motion_modules" in name for name in matched)  # a few frames: not split over sp


def test_many_tiny_attentions_take_xla_and_the_rest_the_kernel(monkeypatch):
    """Temporal attention over a few frames at every pixel is one dense XLA op; other calls use the kernel.
    Both give the reference's values."""
    calls = []
    kernel = sdpa.KERNELS["splash_exp2"]
    monkeypatch.setitem(sdpa.KERNELS, "splash_exp2", lambda *a, **k: calls.append(a[0].shape) or kernel(*a, **k))
    settings = sdpa.AttentionSettings(mesh=None, implementation="splash_exp2")
    key = np.random.default_rng(0)
    for shape, kernel_calls in (((128, 2, 16, 8), 0), ((2, 4, 16, 8), 1), ((64, 4, 136, 8), 1)):
        q, k, v = (jnp.asarray(key.standard_normal(shape), jnp.float32) for _ in range(3))
        out = sdpa._attention(q, k, v, None, scale=None, is_causal=False, enable_gqa=False, settings=settings)
        expected = sdpa.reference_attention(q, k, v)
        assert float(jnp.abs(out - expected).max()) <= 1e-5
        assert len(calls) == kernel_calls, shape
        calls.clear()
