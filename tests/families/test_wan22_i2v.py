"""Wan 2.2 (A14B: two experts; TI2V-5B: 48-channel VAE, per-token timesteps) and Wan image-to-video on JAX: the
subclass and the expert switch (their parity with stock: test_parity; the 8-device mesh: test_mesh.py)."""

import diffusers

import diffusers_tpu
from diffusers_tpu.testing import tiny
from tests.conftest import generate


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
