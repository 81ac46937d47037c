"""The generic path: pipelines with no family file run on JAX with inferred sharding and the same video as torch."""

import diffusers
import numpy as np
import pytest
import torch

import diffusers_tpu
from diffusers_tpu.families import generic
from diffusers_tpu.runtime import registry
from diffusers_tpu.testing import tiny_generic


def test_inferred_rules_shard_whole_heads():
    transformer = tiny_generic.generic_pipeline("latte").transformer  # 4 heads
    rules = dict(generic.infer_rules(transformer, {"dp": 1, "sp": 1, "tp": 4}))
    q = next(spec for pattern, spec in rules.items() if "transformer_blocks\\.0\\.attn1\\.to_q\\.weight" in pattern)
    out = next(
        spec for pattern, spec in rules.items() if "transformer_blocks\\.0\\.attn1\\.to_out\\.0\\.weight" in pattern
    )
    ffn = [spec for pattern, spec in rules.items() if pattern.startswith("^transformer_blocks\\.0\\.ff\\.")]
    assert q == ("tp", None) and out == (None, "tp") and ("tp", None) in ffn and (None, "tp") in ffn
    assert generic.infer_rules(transformer, {"tp": 3}) == ()  # 3 does not divide 4 heads: all replicated


def test_supported_pipelines():
    paths = registry.pipeline_paths()
    assert paths["WanPipeline"] == "family wan" and paths["LattePipeline"] == "generic"
    assert paths["StableDiffusionPipeline"] == "unet" and paths["KandinskyV22Pipeline"] == "unet"
    table = diffusers_tpu.supported_pipelines()
    assert table["WanPipeline"] == table["LattePipeline"] == table["StableDiffusionPipeline"] == "verified"
    assert table["KandinskyV22Pipeline"] == "verified"
    assert table["KandinskyPipeline"] == "verified"
    assert table["KarrasVePipeline"].startswith("untested: runs on the unet path")  # no recipe
    assert table["WuerstchenPriorPipeline"] == "unsupported: no transformer or UNet denoiser"


def test_modular_pipelines_are_refused_naming_the_classic_pipeline_which_then_runs():
    """A modular pipeline moved to "tpu" is refused before anything moves, naming the classic class; doing what the
    error says (the classic pipeline, same components) runs on JAX and matches stock."""
    from diffusers.modular_pipelines import WanModularPipeline

    from diffusers_tpu.testing import tiny

    modular = WanModularPipeline()
    with pytest.raises(
        ValueError,
        match=r"WanModularPipeline is a diffusers modular pipeline.*diffusers\.WanPipeline"
        r"\.from_pretrained.*WanPipeline on JAX: verified.*Nothing was moved",
    ):
        modular.to("tpu")
    assert modular.to("cpu") is modular  # other devices: the stock method
    assert (
        diffusers_tpu.supported_pipelines()["WanModularPipeline"] == "unsupported: a modular pipeline; use WanPipeline"
    )
    classic = getattr(diffusers, "WanPipeline")(**tiny.wan_components("wan"))  # what the error says to use
    expected = classic(
        prompt="a cat",
        num_frames=5,
        height=32,
        width=32,
        num_inference_steps=2,
        output_type="np",
        generator=torch.Generator().manual_seed(0),
    ).frames
    classic.to("jax")
    got = classic(
        prompt="a cat",
        num_frames=5,
        height=32,
        width=32,
        num_inference_steps=2,
        output_type="np",
        generator=torch.Generator().manual_seed(0),
    ).frames
    assert np.abs(got - expected).max() <= 1e-4


def test_flux2_kv_cache_crosses_programs_as_its_tensors():
    """FLUX.2 klein's reference KV cache is a program output and the next program's input: its tensors are pytree
    leaves (``stock_classes``: the KV cache crosses program boundaries as arrays), its reference-token count static."""
    import torch.utils._pytree as pytree
    from diffusers.models.transformers.transformer_flux2 import Flux2KVCache

    cache = Flux2KVCache(num_double_layers=2, num_single_layers=1)
    cache.num_ref_tokens = 5
    cache.get_double(1).store(torch.ones(1, 5, 2, 4), torch.zeros(1, 5, 2, 4))
    leaves, spec = pytree.tree_flatten(cache)
    assert [tuple(x.shape) for x in leaves if x is not None] == [(1, 5, 2, 4)] * 2
    back = pytree.tree_unflatten([None if x is None else x + 1 for x in leaves], spec)
    assert back.num_ref_tokens == 5 and back.get_double(0).k_ref is None and back.get_single(0).v_ref is None
    assert torch.equal(back.get_double(1).k_ref, torch.full((1, 5, 2, 4), 2.0))


def test_a_vae_and_models_without_a_denoiser_take_the_generic_path():
    """LTX's latent upsampler pipeline (a VAE and the upsampler model, no transformer or UNet) runs on JAX, every
    model compiled, with stock's video; pipelines with no VAE beside their models stay refused."""
    from tests.conftest import assert_np_matches
    from tests.sweep.tiny_video_classes import ltx_latent_upsample

    assert registry.models_around_a_vae(diffusers.LTXLatentUpsamplePipeline)
    assert not registry.models_around_a_vae(diffusers.FluxPriorReduxPipeline)
    assert not registry.models_around_a_vae(diffusers.StableDiffusionXLPipeline)  # a UNet: the UNet path
    assert not registry.models_around_a_vae(diffusers.WanPipeline)
    assert registry.pipeline_paths()["LTXLatentUpsamplePipeline"] == "generic"
    pipe, call = ltx_latent_upsample()
    expected = pipe(**call, output_type="np", generator=torch.Generator().manual_seed(0)).frames
    pipe.to("jax")
    assert generic.denoiser_names(pipe) == [] and pipe._diffusers_tpu_runtime.family.name == "generic"
    assert_np_matches(pipe(**call, output_type="np", generator=torch.Generator().manual_seed(0)).frames, expected)
    pipe.to("cpu")
