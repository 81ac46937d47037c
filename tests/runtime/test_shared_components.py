"""Pipelines that share components on JAX (``runtime.shared_components``): diffusers' ``Other(**pipe.components)``
idiom, and ``encode_prompt`` in a text-only pipeline beside a pipeline without text encoders (diffusers' own
``test_encode_prompt_works_in_isolation``); and ``$DIFFUSERS_TPU_CONFIG``, the config of an unchanged script."""

import diffusers
import numpy as np
import pytest
import torch

from diffusers_tpu import TPUConfig
from diffusers_tpu.interop import sharding
from diffusers_tpu.runtime.attach import pipeline_runtime
from diffusers_tpu.testing import tiny

CALL = dict(num_inference_steps=2, height=32, width=32, num_frames=5, output_type="np")
PROMPTS = dict(prompt=["a cat walks", "a red fox jumps over the dog"], negative_prompt=["blurry", "low quality"])


def run(pipe, **extra):
    return pipe(**CALL, **extra, generator=torch.Generator().manual_seed(0)).frames


def test_pipelines_built_from_one_anothers_components_take_them_over_and_back():
    stock = tiny.wan_pipeline()
    reference = run(stock, **PROMPTS)
    text_only = diffusers.WanPipeline(**{**stock.components, "transformer": None, "vae": None}).to("jax")
    embeds, negative = text_only.encode_prompt(**PROMPTS)
    with pytest.raises(ValueError, match="text_encoder of this WanPipeline are on JAX for another pipeline"):
        run(stock, **PROMPTS)  # plain torch cannot run what JAX holds: said before anything runs
    stock_embeds = run(
        diffusers.WanPipeline(**{**stock.components, "text_encoder": None}),
        prompt_embeds=embeds,
        negative_prompt_embeds=negative,
    )
    no_text = diffusers.WanPipeline(**{**stock.components, "text_encoder": None, "tokenizer": None}).to("jax")
    np.testing.assert_allclose(
        run(no_text, prompt_embeds=embeds, negative_prompt_embeds=negative), stock_embeds, atol=1e-5
    )

    full = diffusers.WanPipeline(**stock.components).to("jax")  # holds what the other two placed
    assert pipeline_runtime.runtime_of(no_text) is None and pipeline_runtime.runtime_of(text_only) is None
    np.testing.assert_allclose(run(full, **PROMPTS), reference, atol=1e-5)

    # the pipeline that gave its components away takes them back on its next call, as it was moved
    np.testing.assert_allclose(
        run(no_text, prompt_embeds=embeds, negative_prompt_embeds=negative), stock_embeds, atol=1e-5
    )
    assert pipeline_runtime.runtime_of(full) is None and sharding.is_placed(no_text.transformer)

    # a pipeline cannot take to the host what another holds on JAX: the error says what to do, and doing it works
    with pytest.raises(ValueError, match="move that pipeline to 'cpu' first") as refused:
        full.to("cpu")
    assert "transformer" in str(refused.value) and "vae" in str(refused.value)
    no_text.to("cpu")
    full.to("cpu")
    assert all(p.device.type == "cpu" for p in stock.transformer.parameters())
    np.testing.assert_array_equal(run(stock, **PROMPTS), reference)


def test_the_environment_sets_the_config_of_a_move_that_passes_none(monkeypatch):
    monkeypatch.setenv("DIFFUSERS_TPU_CONFIG", "text_encoder=jax, scan_blocks=false, vae_decode_chunk=2")
    assert TPUConfig.from_environment() == TPUConfig(text_encoder="jax", scan_blocks=False, vae_decode_chunk=2)
    pipe = tiny.wan_pipeline().to("jax")
    try:
        assert pipeline_runtime.runtime_of(pipe).config.text_encoder == "jax"
        assert pipe.text_encoder.device.type == "jax" and pipe.transformer.device.type == "jax"
        assert pipe.to("jax", config=TPUConfig()) is pipe  # a config in code wins
        assert pipeline_runtime.runtime_of(pipe).config == TPUConfig()
    finally:
        pipe.to("cpu")


@pytest.mark.parametrize(
    "text, message",
    [
        ("mesh=2", "set the others with pipe.to('tpu', config=TPUConfig(...))"),
        ("text_encoder", "is not field=value"),
        ("text_encoder=gpu", "DIFFUSERS_TPU_CONFIG='text_encoder=gpu': TPUConfig(text_encoder='gpu') must be one of"),
        ("scan_blocks=maybe", "must be a bool"),
    ],
)
def test_a_bad_environment_config_is_refused_before_anything_moves(monkeypatch, text, message):
    monkeypatch.setenv("DIFFUSERS_TPU_CONFIG", text)
    pipe = tiny.wan_pipeline()
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace("...", r"\.\.\.")):
        pipe.to("jax")
    assert pipeline_runtime.runtime_of(pipe) is None and not sharding.is_placed(pipe.transformer)


@pytest.mark.parametrize("name", ["unet:sd", "generic:easyanimate", "family:ltx2"])
def test_a_text_only_pipeline_of_a_denoiser_class_moves_and_encodes_as_stock(name):
    """diffusers' ``test_encode_prompt_works_in_isolation`` builds the pipeline class with only its text encoders and
    tokenizers: it moves (nothing else to place; a family's head count, read off its missing denoiser, is not asked)
    and ``encode_prompt`` gives stock's embeddings."""
    from diffusers_tpu.testing import tiny_families, tiny_generic, tiny_unet

    module, key = name.split(":")
    builders = dict(unet=lambda: tiny_unet.pipeline(key)[0], family=lambda: tiny_families.pipeline(key)[0])
    pipe = builders.get(module, lambda: tiny_generic.PIPELINES[key]())()
    text_only = {k: (v if "text" in k or "tokenizer" in k else None) for k, v in pipe.components.items()}
    prompt = dict(prompt=["a cat walks", "a red fox jumps"], negative_prompt=["blurry", "low quality"])
    if module == "unet":
        prompt.update(device="cpu", num_images_per_prompt=1, do_classifier_free_guidance=True)
    with torch.no_grad():
        expected = type(pipe)(**text_only).encode_prompt(**prompt)
        moved = type(pipe)(**text_only).to("jax")
        got = moved.encode_prompt(**prompt)
    assert pipeline_runtime.runtime_of(moved) is not None
    for a, b in zip(got, expected):
        if isinstance(b, torch.Tensor):
            np.testing.assert_allclose(a.float().numpy(), b.float().numpy(), atol=1e-5)


def test_a_pipeline_built_on_a_moved_denoiser_runs_where_the_denoiser_is():
    """diffusers' ``Pipeline(**components)`` with another VAE, from a moved pipeline's components (its own ``to()``
    never called): its denoiser is on JAX, so its call takes the components over as the first pipeline was moved
    and gives stock's video; the first pipeline takes them back at its next call."""
    first = tiny.wan_pipeline()
    components = dict(first.components)
    vae = tiny.wan_pipeline(seed=1).vae
    expected = run(diffusers.WanPipeline(**{**components, "vae": vae}), **PROMPTS)
    reference = run(first, **PROMPTS)
    first.to("jax")
    second = diffusers.WanPipeline(**{**components, "vae": vae})
    np.testing.assert_allclose(run(second, **PROMPTS), expected, atol=1e-5)
    assert pipeline_runtime.runtime_of(second) is not None and sharding.is_placed(vae)
    np.testing.assert_allclose(run(first, **PROMPTS), reference, atol=1e-5)
    first.to("cpu")


def test_from_pipe_of_a_moved_pipeline_then_both_run_as_stock():
    """``Other.from_pipe(moved)`` ends with ``to(dtype=float32)``: with every component in that dtype it moves
    nothing (it had taken the shared components off JAX, which the first pipeline holds: refused); the new pipeline
    takes them over at its call, the first one back at its next."""
    stock = tiny.wan_pipeline()
    reference = run(stock, **PROMPTS)
    stock.to("jax")
    other = diffusers.WanPipeline.from_pipe(stock)
    assert not pipeline_runtime.is_attached(other) and pipeline_runtime.is_attached(stock)
    np.testing.assert_allclose(run(other, **PROMPTS), reference, atol=1e-4)
    np.testing.assert_allclose(run(stock, **PROMPTS), reference, atol=1e-4)
    stock.to()  # no device and no dtype: nothing moves
    assert pipeline_runtime.is_attached(stock)
    stock.to("cpu")


def test_a_dropped_pipeline_frees_its_device_arrays():
    """Nothing global holds a moved pipeline: dropped, its runtime, weights and compiled programs go (the owners'
    registry once kept every one alive: a process building pipelines in turn — a notebook, diffusers' own tests —
    grew until XLA:CPU ran out of memory mappings). A component kept keeps its runtime."""
    import gc
    import weakref

    import jax

    def moved_and_called():
        pipe = tiny.wan_pipeline().to("jax")
        run(pipe, prompt="a cat")
        return pipe, weakref.ref(pipeline_runtime.runtime_of(pipe))

    gc.collect()
    before = len(jax.live_arrays())
    pipe, runtime = moved_and_called()
    assert len(jax.live_arrays()) > before
    transformer = pipe.transformer
    del pipe
    gc.collect()
    assert runtime() is not None  # the transformer is still placed by it
    del transformer
    gc.collect()
    assert runtime() is None and len(jax.live_arrays()) == before
