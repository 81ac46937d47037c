"""Wan 2.2 (A14B: two experts; TI2V-5B: 48-channel VAE, per-token timesteps) and Wan image-to-video on JAX match
stock diffusers on torch CPU (1 device; the 8-device mesh is in test_mesh.py)."""

import diffusers
import pytest

import diffusers_tpu
from diffusers_tpu.testing import tiny
from tests.conftest import assert_np_matches, assert_pil_matches, generate, stock_pil

PIPELINES = {
    "wan2.2-a14b": (tiny.wan22_a14b_pipeline, {}),
    "wan2.2-ti2v": (tiny.wan22_ti2v_pipeline, {}),
    "wan2.1-i2v": (tiny.wan_i2v_pipeline, {"image": "image"}),
}


def call_kwargs(extra):
    return {k: tiny.test_image() if v == "image" else v for k, v in extra.items()} | {"num_frames": 9}


@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_matches_stock_torch(name):
    make, extra = PIPELINES[name]
    pipe = make()
    kwargs = call_kwargs(extra)
    reference = {"np": generate(pipe, output_type="np", **kwargs)}
    reference["pil"] = stock_pil(reference["np"])
    pipe.to("jax")
    runtime = pipe._diffusers_tpu_runtime
    assert_np_matches(generate(pipe, output_type="np", **kwargs), reference["np"])
    assert_pil_matches(generate(pipe, output_type="pil", **kwargs), reference["pil"])
    assert runtime.config.postprocess_on_device and "postprocess_video" in vars(pipe.video_processor)
    if name == "wan2.2-a14b":  # both experts are sharded and compiled
        for expert in (pipe.transformer, pipe.transformer_2):
            assert diffusers_tpu.sharding_of(expert.blocks[0].attn1.to_q.weight) is not None
            assert "forward" in vars(expert)
    if name == "wan2.1-i2v":  # the CLIP image encoder runs on JAX too
        assert diffusers_tpu.sharding_of(pipe.image_encoder.embeddings.patch_embedding.weight) is not None


def test_i2v_subclass_is_provided():
    assert issubclass(diffusers_tpu.WanImageToVideoPipeline, diffusers.WanImageToVideoPipeline)
    assert "WanImageToVideoPipeline" in diffusers_tpu.supported_pipelines()


def test_experts_switch_at_the_boundary():
    pipe = tiny.wan22_a14b_pipeline().to("jax")
    calls = []
    for name in ("transformer", "transformer_2"):
        module, forward = getattr(pipe, name), getattr(pipe, name).forward
        module.forward = lambda *a, _n=name, _f=forward, **k: calls.append(_n) or _f(*a, **k)
    generate(pipe, output_type="latent", num_inference_steps=4)
    assert "transformer" in calls and "transformer_2" in calls
    assert calls == sorted(calls, key=lambda n: n == "transformer_2")  # high-noise expert first, then low-noise
