"""Porting a GPU script: what real scripts do around the call works on JAX exactly as on stock torch, or gets a
defined behaviour (docs/porting.md). Each scenario runs the same code on stock torch CPU."""

import logging

import diffusers
import numpy as np
import pytest
import torch
from diffusers.callbacks import PipelineCallback

from diffusers_tpu.interop import compile_accounting
from diffusers_tpu.runtime.attach import pipeline_runtime
from diffusers_tpu.runtime.gpu_script import model_offload
from diffusers_tpu.testing import tiny
from tests.conftest import assert_np_matches, generate

STEPS = 2


def plain(value) -> bool:
    """An ordinary host tensor: a torch.Tensor on the CPU, not a torchax one."""
    return type(value) is torch.Tensor and value.device.type == "cpu"


def run(pipe, **overrides):
    return generate(pipe, **dict(dict(output_type="np", num_inference_steps=STEPS), **overrides))


@pytest.fixture(scope="module")
def stock():
    pipe = tiny.wan_pipeline("wan")
    return pipe, run(pipe)


@pytest.fixture(scope="module")
def moved():
    return tiny.wan_pipeline("wan").to("jax")


def test_what_leaves_the_library_is_plain_torch(stock, moved, tmp_path):
    ref, reference = stock
    pipe = moved
    texts = dict(
        prompt=tiny.WAN_CALL["prompt"], negative_prompt=tiny.WAN_CALL["negative_prompt"], max_sequence_length=512
    )
    embeds, negative = pipe.encode_prompt(**texts, device=pipe.device)
    ref_embeds, ref_negative = ref.encode_prompt(**texts)
    assert plain(embeds) and plain(negative) and embeds.numpy().shape == tuple(ref_embeds.shape)
    assert torch.allclose(embeds, ref_embeds, atol=1e-6) and torch.allclose(negative, ref_negative, atol=1e-6)
    # precomputed embeddings go back in: CPU tensors as inputs
    call = {k: v for k, v in tiny.WAN_CALL.items() if k not in ("prompt", "negative_prompt")}
    out = pipe(
        **dict(call, num_inference_steps=STEPS),
        prompt_embeds=embeds,
        negative_prompt_embeds=negative,
        output_type="np",
        generator=torch.Generator().manual_seed(0),
    ).frames
    assert_np_matches(out, reference)

    # output_type="latent", then the user's own decode (the diffusers docs' recipe)
    latents = run(pipe, output_type="latent")
    assert plain(latents)
    vae = pipe.vae
    mean = torch.tensor(vae.config.latents_mean).view(1, vae.config.z_dim, 1, 1, 1)
    std = 1.0 / torch.tensor(vae.config.latents_std).view(1, vae.config.z_dim, 1, 1, 1)
    video = vae.decode(latents / std + mean, return_dict=False)[0]
    assert plain(video) and plain(video * 2 - video.cpu())  # arithmetic with CPU tensors
    frames = pipe.video_processor.postprocess_video(video, output_type="np")
    assert_np_matches(frames, reference)
    path = tmp_path / "user.mp4"
    diffusers.utils.export_to_video(list(frames[0]), str(path), fps=8)
    assert path.stat().st_size > 0

    # a direct transformer call and a VAE encode, as image-to-video scripts do
    x = torch.randn(1, 16, 3, 4, 4, generator=torch.Generator().manual_seed(1))
    t = torch.tensor([500.0])
    out = pipe.transformer(hidden_states=x, timestep=t, encoder_hidden_states=embeds[:1], return_dict=False)[0]
    with torch.no_grad():
        expected = ref.transformer(
            hidden_states=x, timestep=t, encoder_hidden_states=ref_embeds[:1], return_dict=False
        )[0]
    assert plain(out) and torch.allclose(out, expected, atol=1e-4)
    image = video[:, :, :5]
    encoded = pipe.vae.encode(image).latent_dist
    with torch.no_grad():
        ref_encoded = ref.vae.encode(image).latent_dist
    assert plain(encoded.mode()) and torch.allclose(encoded.mode(), ref_encoded.mode(), atol=1e-4)
    generator = torch.Generator().manual_seed(3)
    assert torch.allclose(encoded.sample(generator), ref_encoded.sample(torch.Generator().manual_seed(3)), atol=1e-4)
    # the scheduler is a host object between calls
    assert plain(pipe.scheduler.timesteps) and plain(pipe.scheduler.sigmas)


class ScaleEmbeddings(PipelineCallback):
    """A PipelineCallback with its own tensor list (the pipeline must pass these, not the default)."""

    tensor_inputs = ["latents", "prompt_embeds"]

    def callback_fn(self, pipeline, step_index, timestep, callback_kwargs):
        assert plain(callback_kwargs["prompt_embeds"])
        if step_index == 0:
            callback_kwargs["prompt_embeds"] = callback_kwargs["prompt_embeds"] * 10.0
        return callback_kwargs


def test_callbacks_see_host_tensors_and_their_edits_count(stock, moved):
    ref, reference = stock
    seen = {}

    def callback(pipe, step, timestep, tensors):
        latents = tensors["latents"]
        seen.setdefault(id(pipe), []).append((plain(latents), plain(timestep), float(latents.abs().mean())))
        if step == 0:
            preview = pipe.vae.decode(latents[:1], return_dict=False)[0]  # a preview decode inside the callback
            assert plain(preview) and preview.shape[2] == tiny.WAN_CALL["num_frames"]
            latents.mul_(0.9)  # edited in place: must reach the device too
            return {"latents": latents}
        return {"latents": latents * 0.5 + 0.1}  # a new tensor

    expected = run(ref, callback_on_step_end=callback)
    out = run(moved, callback_on_step_end=callback)
    assert np.abs(expected - reference).max() > 1e-2  # the callback changed the video
    assert_np_matches(out, expected)
    ours, theirs = seen[id(moved)], seen[id(ref)]
    assert all(p and t for p, t, _ in ours) and len(ours) == STEPS
    np.testing.assert_allclose([m for *_, m in ours], [m for *_, m in theirs], rtol=1e-5)

    expected = run(ref, callback_on_step_end=ScaleEmbeddings())
    assert np.abs(expected - reference).max() > 1e-3
    assert_np_matches(run(moved, callback_on_step_end=ScaleEmbeddings()), expected)


def test_a_users_own_denoising_loop(stock, moved):
    """The scheduler stays a host object and the transformer a function of host tensors: a hand-written loop works."""
    ref = stock[0]

    def loop(pipe):
        embeds, _ = pipe.encode_prompt(prompt="a fox", do_classifier_free_guidance=False, max_sequence_length=16)
        scheduler = type(pipe.scheduler).from_config(pipe.scheduler.config)
        scheduler.set_timesteps(3)
        latents = torch.randn(1, 16, 3, 4, 4, generator=torch.Generator().manual_seed(5))
        for t in scheduler.timesteps:
            with torch.no_grad():
                noise = pipe.transformer(
                    hidden_states=latents, timestep=t.expand(1), encoder_hidden_states=embeds, return_dict=False
                )[0]
            latents = scheduler.step(noise, t, latents, return_dict=False)[0]
        return latents

    ours = loop(moved)
    assert plain(ours) and torch.allclose(ours, loop(ref), atol=1e-4)


def test_gpu_calls_get_their_tpu_meaning(stock, monkeypatch, caplog):
    ref, reference = stock
    monkeypatch.setenv("DIFFUSERS_TPU_PLATFORM", "cpu")  # "tpu" rehearses on this machine
    caplog.set_level(logging.WARNING, logger="diffusers_tpu")
    pipe = tiny.wan_pipeline("wan")
    pipe.enable_model_cpu_offload(device="tpu")  # the GPU script's memory saver: model offload on JAX
    assert pipeline_runtime.is_attached(pipe) and isinstance(pipe.transformer._hf_hook, model_offload.DeviceOffload)
    assert pipe.transformer.device.type == "cpu"  # on the host until it runs (test_model_offload)
    pipe.remove_all_hooks()
    for call in (  # (enable_sequential_cpu_offload: sequential offload on JAX, test_sequential_offload)
        "enable_attention_slicing",
        "enable_xformers_memory_efficient_attention",
    ):
        caplog.clear()
        getattr(pipe, call)()
        assert f"{call}() on a pipeline on JAX is ignored" in caplog.text and pipeline_runtime.is_attached(pipe)

    generator = torch.Generator(device="tpu")  # torch has no "tpu" generator: it is the CPU one
    assert isinstance(generator, torch.Generator) and generator.device.type == "cpu"
    assert torch.equal(
        torch.randn(4, generator=generator.manual_seed(7)), torch.randn(4, generator=torch.Generator().manual_seed(7))
    )
    out = pipe(
        **dict(tiny.WAN_CALL, num_inference_steps=STEPS, output_type="np"),
        generator=torch.Generator("tpu").manual_seed(0),
    ).frames
    assert_np_matches(out, reference)

    caplog.clear()
    pipe.transformer.compile()  # XLA compiles it: ignored on JAX, restored on torch
    pipe.transformer.set_attention_backend("_native_math")
    assert "has no effect on JAX" in caplog.text and "set_attention_backend('_native_math')" in caplog.text
    with diffusers.attention_backend("_native_math"):
        assert_np_matches(run(pipe), reference)
    assert pipe.transformer._compiled_call_impl is None
    pipe.to("cpu")
    assert pipe.transformer._compiled_call_impl is not None  # back on torch, as the script asked
    assert pipe.transformer.blocks[0].attn1.processor._attention_backend.value == "_native_math"


def test_set_up_before_the_move(stock, caplog):
    ref, reference = stock
    caplog.set_level(logging.WARNING, logger="diffusers_tpu")
    offloaded = tiny.wan_pipeline("wan")
    offloaded.enable_model_cpu_offload(device="cpu")
    compiled = tiny.wan_pipeline("wan")
    compiled.transformer = torch.compile(compiled.transformer)
    for pipe in (offloaded, compiled):
        pipe.to("jax")
        assert_np_matches(run(pipe), reference)
        pipe.to("cpu")
    assert "offload hooks are removed" in caplog.text and "torch.compile'd" in caplog.text
    assert type(compiled.transformer).__name__ == "OptimizedModule"  # the script's wrapper is back

    casting = tiny.wan_pipeline("wan")
    casting.transformer.enable_layerwise_casting(storage_dtype=torch.float8_e4m3fn, compute_dtype=torch.float32)
    with (
        compile_accounting.compile_log() as log,
        pytest.raises(ValueError, match="enable_layerwise_casting.*TPUConfig"),
    ):
        casting.to("jax")
    assert log.compilations == 0 and not pipeline_runtime.is_attached(casting)
    assert all(type(p) is torch.nn.Parameter for p in casting.transformer.parameters())


def test_float16_on_tpu_warns_and_runs(monkeypatch, caplog):
    monkeypatch.setenv("DIFFUSERS_TPU_PLATFORM", "cpu")
    caplog.set_level(logging.WARNING, logger="diffusers_tpu")
    pipe = tiny.wan_pipeline("wan")
    pipe.transformer.to(torch.float16)
    pipe.to("tpu")
    assert "float16" in caplog.text and "bfloat16" in caplog.text
    assert pipe.transformer.dtype == torch.float16
    assert np.isfinite(run(pipe, num_inference_steps=1)).all()


def test_vae_slicing_and_compiled_tiling(stock, moved):
    ref, reference = stock
    moved.vae.enable_slicing()
    try:
        assert_np_matches(run(moved), reference)  # two prompts: decoded one at a time
    finally:
        moved.vae.disable_slicing()
    # tiles along the width only (2 tile shapes), 2 latent frames: the tiles' programs compile once
    tiles = dict(
        tile_sample_min_height=24, tile_sample_min_width=32, tile_sample_stride_height=24, tile_sample_stride_width=16
    )
    z = torch.randn(1, 16, 2, 3, 6, generator=torch.Generator().manual_seed(2))
    x = torch.rand(1, 3, 5, 24, 48, generator=torch.Generator().manual_seed(3)) * 2 - 1
    ref.vae.enable_tiling(**tiles)
    try:
        with torch.no_grad():
            expected, expected_latent = ref.vae.decode(z).sample, ref.vae.encode(x).latent_dist.mode()
        ref.vae.disable_tiling()
        with torch.no_grad():
            untiled = ref.vae.decode(z).sample
    finally:
        ref.vae.disable_tiling()
    assert (expected - untiled).abs().max() > 1e-3  # the tiles blend: not the untiled decode
    moved.vae.enable_tiling(**tiles)
    try:
        decoded, latent = moved.vae.decode(z).sample, moved.vae.encode(x).latent_dist.mode()
        assert torch.allclose(decoded, expected, atol=1e-4) and torch.allclose(latent, expected_latent, atol=1e-4)
        with compile_accounting.compile_log() as log:
            moved.vae.decode(z)
        assert log.compilations == 0
        shapes = {key[2][0][0] for key in moved.vae._diffusers_tpu_programs["decode_first"].programs}
        assert {(1, 16, 1, 3, 4), (1, 16, 1, 3, 2)} <= shapes  # one program per tile shape, none op by op
    finally:
        moved.vae.disable_tiling()


def test_tied_weights_stay_tied():
    """T5's input embedding is one Parameter in two places: placing, casting on the devices and coming back keep it
    one (it was restored as two host copies, doubling its memory and untying later edits)."""
    from diffusers_tpu import TPUConfig
    from diffusers_tpu.testing import tiny

    pipe = tiny.hunyuan15_pipeline()
    encoder = pipe.text_encoder_2  # ByT5: shared.weight is encoder.embed_tokens.weight
    original = encoder.shared.weight.detach().clone()
    pipe.to("jax", config=TPUConfig(text_encoder="jax"))
    assert encoder.shared.weight is encoder.encoder.embed_tokens.weight
    pipe.to(torch.bfloat16)
    assert encoder.shared.weight is encoder.encoder.embed_tokens.weight
    pipe.to("cpu")
    assert encoder.shared.weight is encoder.encoder.embed_tokens.weight
    assert encoder.shared.weight.dtype == torch.bfloat16
    torch.testing.assert_close(encoder.shared.weight.float(), original.to(torch.bfloat16).float(), rtol=0, atol=0)


def test_the_callers_prompt_list_is_written_as_stock_writes_it():
    """Stock Z-Image writes its chat template into the caller's prompt lists, so a second call with the same lists
    encodes the templated strings again (another image): on JAX the lists change the same way and both calls give
    stock's two images (before: the runtime encoded copies of the lists, and its second image was not stock's)."""
    from diffusers_tpu.testing import tiny_images

    def twice(pipe, call):
        outputs = [pipe(**call, output_type="np", generator=torch.Generator().manual_seed(0)).images for _ in "ab"]
        return outputs, (list(call["prompt"]), list(call["negative_prompt"]))

    stock, call = tiny_images.z_image(0)
    expected, written = twice(stock, dict(call, prompt=list(call["prompt"]), negative_prompt=["blurry", "dark"]))
    assert written[0][0] != call["prompt"][0] and np.abs(expected[0] - expected[1]).max() > 1e-3
    moved, _ = tiny_images.z_image(0)
    moved.to("jax")
    try:
        outputs, moved_written = twice(
            moved, dict(call, prompt=list(call["prompt"]), negative_prompt=["blurry", "dark"])
        )
    finally:
        moved.to("cpu")
    assert moved_written == written
    for output, reference in zip(outputs, expected):
        assert_np_matches(output, reference)
