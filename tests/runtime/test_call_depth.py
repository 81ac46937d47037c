"""At most five of the project's frames between stock code and any program a call runs (compiled programs, jitted
functions, eager ops), on the first call and the next, through the pipeline and through the public entry points
users call themselves (``tests/call_depth.py`` walks the stack at each)."""

import pytest
import torch

from diffusers_tpu import TPUConfig
from diffusers_tpu.testing import tiny, tiny_families
from tests.call_depth import MOST, measured
from tests.sweep.recipes import RECIPES


def _wan():
    call = dict(prompt="a cat", negative_prompt="blurry", height=32, width=32, num_frames=5, guidance_scale=4.0)
    return tiny.wan_pipeline("wan"), dict(call, num_inference_steps=2)


def _hunyuan15():
    call = dict(prompt="a cat", height=32, width=32, num_frames=5, num_inference_steps=2)
    return tiny.hunyuan15_pipeline(), call


PIPELINES = {
    "wan": _wan,  # the guidance pair batched, the Wan VAE's chunked programs
    "hunyuanvideo15": _hunyuan15,  # a family hook
    "ltx2": lambda: tiny_families.pipeline("ltx2"),  # an audio VAE, a text connector
    "flux": RECIPES["FluxPipeline"],
    "stable-diffusion": RECIPES["StableDiffusionPipeline"],
}


@pytest.mark.parametrize("name", list(PIPELINES))
def test_every_program_a_call_runs_is_at_most_five_of_our_frames_from_stock_code(name):
    pipe, call = PIPELINES[name]()
    pipe.set_progress_bar_config(disable=True)
    pipe.to("jax", config=TPUConfig(batch_cfg=True, compile_cache_dir=False))
    try:
        for attempt in ("first call", "second call"):
            with measured(__file__) as depths:
                pipe(**call, output_type="np")
            assert depths.counts, "no program seen: the walk measures nothing"
            assert depths.deepest <= MOST, f"{name}, {attempt}: {depths!r}"
    finally:
        pipe.to("cpu")


def test_the_public_entry_points_users_call_are_as_shallow():
    pipe, call = _wan()
    pipe.to("jax", config=TPUConfig(compile_cache_dir=False))
    try:
        with measured(__file__) as depths:
            embeds, _ = pipe.encode_prompt("a cat", do_classifier_free_guidance=False)
            latents = torch.randn(1, 16, 2, 4, 4)
            noise = pipe.transformer(latents, timestep=torch.tensor([500]), encoder_hidden_states=embeds)[0]
            pipe.vae.decode(noise, return_dict=False)
        assert depths.counts and depths.deepest <= MOST, repr(depths)
    finally:
        pipe.to("cpu")
