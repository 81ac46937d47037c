"""Every family's programs compiled by the real TPU compiler (libtpu) for v5e and v6e slices, no TPU attached:
the denoiser step as the runtime compiles it (the project's exp2 Pallas kernel through Mosaic included, weights
sharded, the guidance pair batched) on 1 and 4 chips, and the 2-D VAE decoders. The 3-D VAE decoders take the TPU
compiler minutes each: ``tests/planner/test_tpu_vae.py`` (``-m tpu_slow``, CI's second command)."""

import time

import pytest

from diffusers_tpu import TPUConfig
from diffusers_tpu.planner import hlo_stats, tpu_check, tpu_compiler
from diffusers_tpu.testing import tiny, tiny_families, tiny_images, tiny_unet

pytestmark = pytest.mark.skipif(not tpu_compiler.available(), reason="libtpu (the TPU compiler) not installed")

VIDEO = dict(
    prompt=["a cat walks on the grass", "a red fox jumps over a sleeping dog in the snow"],
    negative_prompt=["blurry", "low quality, static, deformed"],
    height=32,
    width=32,
    num_frames=9,
    max_sequence_length=24,
)


def build(name):
    """``(pipe, call)`` of a tiny pipeline of every family (and the generic path's)."""
    if name in tiny_families.PIPELINES:
        return tiny_families.pipeline(name)
    if name in tiny_images.PIPELINES:
        return tiny_images.pipeline(name)
    if name in tiny_unet.PIPELINES:
        return tiny_unet.pipeline(name)
    builders = {
        "wan": lambda: tiny.wan_pipeline("wan-4head"),
        "wan22-a14b": tiny.wan22_a14b_pipeline,
        "wan22-ti2v": tiny.wan22_ti2v_pipeline,
        "cogvideox-5b": lambda: tiny.cogvideox_pipeline("cogvideox-5b"),
        "cogvideox1.5": lambda: tiny.cogvideox_pipeline("cogvideox1.5"),
        "cogvideox-d64": lambda: tiny.cogvideox_pipeline("cogvideox-d64"),  # the kernel's packed head pairs
        "hunyuanvideo15": tiny.hunyuan15_pipeline,
        "causal-wan": tiny.causal_wan_pipeline,
    }
    if name == "hunyuanvideo15":  # (stock's VAE decodes one video at a time: its causal mask is batch 1)
        return builders[name](), dict(VIDEO, prompt="a cat walks on the grass", negative_prompt="blurry")
    if name in builders:
        return builders[name](), dict(VIDEO, num_frames=9 if name != "cogvideox1.5" else 13)
    from diffusers_tpu.testing import tiny_generic

    pipe = tiny_generic.generic_pipeline(name)
    return pipe, tiny_generic.generic_call(pipe)


FAMILIES = [
    "wan",
    "wan22-a14b",
    "wan22-ti2v",
    "causal-wan",
    "cogvideox-5b",
    "cogvideox1.5",
    "cogvideox-d64",
    "hunyuanvideo15",
    "hunyuan-video",
    "ltx",
    "ltx2",
    "skyreels-v2",
    "wan-vace",
    "wan-animate",
    "flux",
    "qwen-image",
    "z-image",
    "latte",
    "mochi",
]
IMAGE_VAES = ("flux", "sdxl")  # a 2-D decoder, seconds to compile (Z-Image's, with upsamplers, is in test_tpu_vae.py)


def summarise(lowered):
    start = time.perf_counter()
    return hlo_stats.summary(lowered.compile(), seconds=time.perf_counter() - start)


# With CI's second command (-m tpu_slow), keeping the main suite under 20 minutes on 2 cores: every family on a
# 4-chip v6e slice (weights sharded, the pair batched) and on one v5e chip, the UNet family on one slice each (15-47 s
# each for the TPU compiler here; its 1- and 4-chip programs differ only by sharding, which the others cover).
CASES = [pytest.param(name, chip, marks=pytest.mark.tpu_slow) for name in FAMILIES for chip in ("v6e-4", "v5e-1")] + [
    pytest.param(name, chip, marks=pytest.mark.tpu_slow)
    for name, chip in (("sdxl", "v6e-4"), ("svd", "v5e-1"), ("animatediff", "v6e-4"))
]


@pytest.mark.parametrize("name,chip", CASES)
def test_every_family_compiles_for_tpu(name, chip):
    pipe, call = build(name)
    programs = tpu_check.compile_for(
        pipe, call, chip, config=TPUConfig(text_encoder="host"), analyse=summarise, vae=name in IMAGE_VAES
    )
    step = programs["denoiser_step"]
    if name == "mochi":  # its attention compacts text tokens with torch.nonzero: the runtime runs it eagerly
        assert step["eager"].startswith("ConcretizationTypeError")
        return
    assert step["generated_code_bytes"] > 0 and step["argument_bytes"] > 0
    assert step["hlo"]["total"]["custom_calls"].get("tpu_custom_call", 0) >= 1  # the exp2 kernel, through Mosaic
    assert step["hlo"]["total"]["attention_calls"] >= 1
    if name in IMAGE_VAES:
        assert any(key.startswith("vae_") for key in programs)
