"""Stock diffusers.WanPipeline on JAX: compiles, weights, outputs and options (its parity with stock: test_parity)."""

import diffusers
import numpy as np
import pytest
import torch

import diffusers_tpu
from diffusers_tpu.interop import compile_accounting
from diffusers_tpu.runtime.attach import pipeline_runtime
from diffusers_tpu.testing import tiny
from tests.conftest import assert_np_matches, generate


def test_second_identical_call_compiles_nothing():
    pipe = tiny.wan_pipeline("wan").to("jax")
    first = generate(pipe, output_type="np")
    assert diffusers_tpu.stats(pipe).compilations > 0
    with compile_accounting.compile_log() as log:
        second = generate(pipe, output_type="np")
    assert log.compilations == 0, f"{log.compilations} programs compiled on a warm call"
    assert diffusers_tpu.stats(pipe).compilations == 0
    np.testing.assert_array_equal(first, second)
    # the transformer program is shared by all steps: one program per input structure
    assert len(_compiled(pipe).programs) == 1


def test_weights_are_torchax_tensors_with_named_sharding():
    from jax.sharding import NamedSharding
    from torchax.tensor import Tensor

    pipe = tiny.wan_pipeline("wan").to("jax")
    params = list(pipe.transformer.parameters())
    assert params and all(isinstance(p, Tensor) for p in params)
    assert all(isinstance(diffusers_tpu.sharding_of(p), NamedSharding) for p in params)
    assert isinstance(pipe.transformer, diffusers.WanTransformer3DModel)  # still the stock module
    assert isinstance(pipe.text_encoder.shared.weight, torch.Tensor) and pipe.text_encoder.device.type == "cpu"
    pipe.to("cpu")
    assert all(type(p) is torch.nn.Parameter and p.device.type == "cpu" for p in pipe.transformer.parameters())


def test_subclass_from_pretrained_and_text_encoder_on_jax(tmp_path):
    path = tiny.save_wan_pipeline(tmp_path / "tiny-wan", variant="wan-4head")
    pipe = diffusers_tpu.WanPipeline.from_pretrained(path)
    assert type(pipe) is diffusers_tpu.WanPipeline
    reference = generate(pipe, output_type="np")
    pipe.to("jax", config=diffusers_tpu.TPUConfig(text_encoder="jax"))
    from torchax.tensor import Tensor

    assert isinstance(pipe.text_encoder.shared.weight, Tensor)
    assert_np_matches(generate(pipe, output_type="np"), reference)


def test_pt_and_latent_outputs_are_host_tensors():
    pipe = tiny.wan_pipeline("wan")
    reference = {kind: generate(pipe, output_type=kind) for kind in ("pt", "latent")}
    pipe.to("jax")
    for kind, ref in reference.items():
        out = generate(pipe, output_type=kind)
        assert type(out) is torch.Tensor and out.device.type == "cpu" and out.shape == ref.shape
        assert (out - ref).abs().max().item() <= 1e-4


def test_single_prompt_without_guidance_and_several_videos_per_prompt():
    pipe = tiny.wan_pipeline("wan")
    calls = [
        dict(prompt="a cat", guidance_scale=1.0, negative_prompt=None),
        dict(prompt="a cat", negative_prompt="blurry", num_videos_per_prompt=2),
    ]
    reference = [generate(pipe, output_type="np", **c) for c in calls]
    pipe.to("jax", config=diffusers_tpu.TPUConfig(batch_cfg=True))
    for call, ref in zip(calls, reference):
        assert_np_matches(generate(pipe, output_type="np", **call), ref)


def _compiled(pipe):
    """A placed transformer's compiled program, found by its layer's name."""
    return pipeline_runtime.runtime_of(pipe).compiled_of(pipe.transformer)


def test_cfg_pair_runs_as_one_batch():
    pipe = tiny.wan_pipeline("wan")
    reference = generate(pipe, output_type="np")
    pipe.to("jax", config=diffusers_tpu.TPUConfig(batch_cfg=True))
    generate(pipe, output_type="np")  # compile
    batches = []
    for program in _compiled(pipe).programs.values():
        executable = program.executable
        program.executable = lambda state, dynamic, donated, extra, *carried, _e=executable: (
            batches.append(dynamic[0].shape[0]) or _e(state, dynamic, donated, extra, *carried)
        )
    out = generate(pipe, output_type="np")
    batch = len(tiny.WAN_CALL["prompt"])
    # one denoiser program call per step, with cond and uncond in one batch
    assert batches == [2 * batch] * tiny.WAN_CALL["num_inference_steps"], batches
    assert pipe._diffusers_tpu_runtime.pairing.batched_steps == tiny.WAN_CALL["num_inference_steps"]
    assert_np_matches(out, reference)


def test_cfg_pairing_falls_back_when_a_callback_swaps_embeddings():
    pipe = tiny.wan_pipeline("wan")

    def swap(pipe_, step, timestep, tensors):
        return {"negative_prompt_embeds": tensors["negative_prompt_embeds"] * 0.5} if step == 0 else {}

    kwargs = dict(
        output_type="np", callback_on_step_end=swap, callback_on_step_end_tensor_inputs=["negative_prompt_embeds"]
    )
    reference = generate(pipe, **kwargs)
    pipe.to("jax", config=diffusers_tpu.TPUConfig(batch_cfg=True))
    assert_np_matches(generate(pipe, **kwargs), reference)


def test_progress_bar_reports_step_time_and_compile_separately():
    import io

    pipe = tiny.wan_pipeline("wan").to("jax")
    stream = io.StringIO()
    pipe.set_progress_bar_config(file=stream)
    generate(pipe, output_type="np")
    text = stream.getvalue()
    assert "step=" in text and "avg=" in text and "compile=" in text, text
    stats = diffusers_tpu.stats(pipe)
    assert len(stats.step_seconds) == tiny.WAN_CALL["num_inference_steps"]
    assert stats.compile_seconds > 0 and stats.run_seconds > 0
    assert stats.total_seconds >= stats.compile_seconds


def test_a_class_s_own_progress_bar_options_pass_through():
    """Marigold's ``progress_bar(..., desc=..., leave=False)`` through the timed bar (it raised TypeError)."""
    from types import SimpleNamespace

    from diffusers_tpu.runtime.call import call_stats

    seen = []
    bar = call_stats.timed_progress_bar(SimpleNamespace(), lambda *a, **k: seen.append((a, k)) or "bar")
    assert bar(range(3), None, desc="Diffusion steps", leave=False) == "bar"
    assert seen == [((range(3), None), dict(desc="Diffusion steps", leave=False))]


def test_dtype_casts_follow_stock_semantics():
    pipe = tiny.wan_pipeline("wan").to("jax")
    pipe.to(torch.bfloat16)  # dtype only, while on JAX: cast on the devices, keep the sharding
    weight = pipe.transformer.blocks[0].attn1.to_q.weight
    assert weight.dtype == torch.bfloat16 and pipe.vae.dtype == torch.bfloat16
    assert pipe.text_encoder.dtype == torch.bfloat16  # the host text encoder too
    assert diffusers_tpu.sharding_of(weight) is not None
    out = generate(pipe, output_type="np")
    assert np.isfinite(out).all() and out.dtype == np.float32
    pipe.to("cpu")  # like stock to(dtype): the cast persists on torch
    assert pipe.transformer.blocks[0].attn1.to_q.weight.dtype == torch.bfloat16


def test_compile_cache_dir_knob(tmp_path):
    import os

    import jax

    suite_threshold = jax.config.jax_persistent_cache_min_compile_time_secs  # conftest lowers it for the suite
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)  # JAX's own default
    pipe = tiny.wan_pipeline("wan")
    try:
        pipe.to("jax", config=diffusers_tpu.TPUConfig(compile_cache_dir=str(tmp_path)))
        assert jax.config.jax_compilation_cache_dir == str(tmp_path)
        assert jax.config.jax_persistent_cache_min_compile_time_secs == 0  # small programs cached too
        pipe.to("jax", config=diffusers_tpu.TPUConfig(compile_cache_dir=False))
        assert jax.config.jax_compilation_cache_dir is None
        assert jax.config.jax_persistent_cache_min_compile_time_secs == 1.0  # JAX's default back
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 2.5)  # a user's own threshold is kept
        pipe.to("jax")  # default: $DIFFUSERS_TPU_CACHE_DIR (set by conftest) or the user cache dir
        assert jax.config.jax_compilation_cache_dir == os.environ["DIFFUSERS_TPU_CACHE_DIR"]
        assert jax.config.jax_persistent_cache_min_compile_time_secs == 2.5
    finally:
        pipe.to("cpu")
        jax.config.update("jax_persistent_cache_min_compile_time_secs", suite_threshold)


def test_save_pretrained_while_on_jax_round_trips(tmp_path):
    from diffusers_tpu.runtime.attach import pipeline_runtime

    pipe = tiny.wan_pipeline("wan-4head")
    reference = generate(pipe, output_type="np")
    pipe.to("jax", config=diffusers_tpu.TPUConfig(text_encoder="jax"))
    pipe.save_pretrained(str(tmp_path), safe_serialization=True)
    assert pipeline_runtime.is_attached(pipe)  # saving did not move the pipeline
    reloaded = diffusers.WanPipeline.from_pretrained(str(tmp_path))  # plain torch, from the saved safetensors
    assert_np_matches(generate(reloaded, output_type="np"), reference)


@pytest.mark.parametrize("kernel", ["splash_exp2", "splash", "xla"])
def test_every_tpu_attention_choice_matches_stock(kernel):
    pipe = tiny.wan_pipeline("wan-4head")
    reference = generate(pipe, output_type="np")
    pipe.to("jax", config=diffusers_tpu.TPUConfig(attention=kernel, attention_k_smoothing=kernel == "splash_exp2"))
    assert pipe._diffusers_tpu_runtime.attention.implementation == kernel
    assert_np_matches(generate(pipe, output_type="np"), reference)
