"""Stock diffusers.HunyuanVideo15Pipeline on JAX matches the same pipeline on torch CPU: text-padding key mask
(no S x S mask), jit-safe token reordering, no NaN, frame-causal VAE attention without the Python loop."""

import diffusers
import jax
import numpy as np
import pytest
import torch
from diffusers.models.transformers.transformer_hunyuan_video15 import HunyuanVideo15AttnProcessor2_0

import diffusers_tpu
from diffusers_tpu import TPUConfig
from diffusers_tpu.families import hunyuan_video15
from diffusers_tpu.interop import backend, jit, user_tensors
from diffusers_tpu.interop.program import Program
from diffusers_tpu.runtime import decision
from diffusers_tpu.runtime.attach import pipeline_runtime
from diffusers_tpu.testing import tiny, tiny_hunyuan
from tests.conftest import all_equations, assert_np_matches, compiled_method, stock_pil

# A CFG pair of different padded lengths; the prompt's quoted text goes through ByT5, the negative has none (all
# its ByT5 tokens are padding). Guidance is on (scale 6).
CALL = dict(
    prompt='a cat holding a sign saying "hello" in the rain',
    negative_prompt="blurry",
    height=32,
    width=48,
    num_frames=9,
    num_inference_steps=3,
)


def generate(pipe, seed=0, **overrides):
    return pipe(**dict(CALL, **overrides), generator=torch.Generator().manual_seed(seed)).frames


@pytest.fixture(scope="module")
def stock():
    pipe = tiny.hunyuan15_pipeline()
    reference = generate(pipe, output_type="np")
    return pipe, {"np": reference, "pil": stock_pil(reference)}


def _traced_shapes(pipe):
    """Shapes inside the transformer program the pipeline runs, traced with the arguments of its last call."""
    compiled = compiled_method(pipe, pipe.transformer)
    calls, arguments = [], Program.arguments
    Program.arguments = lambda self, state, dynamic, extra=(), carried=(): (
        calls.append((self, state, dynamic)) or arguments(self, state, dynamic, extra, carried)
    )
    try:
        generate(pipe, output_type="latent", num_inference_steps=1)
    finally:
        Program.arguments = arguments
    program, state, dynamic = [c for c in calls if c[0] in compiled.programs.values()][-1]
    with compiled.jax_context():
        jaxpr = jax.make_jaxpr(program.jitted)(state, dynamic, [], []).jaxpr
    return {tuple(v.aval.shape) for eqn in all_equations(jaxpr) for v in eqn.outvars if hasattr(v.aval, "shape")}


def test_no_dense_attention_mask_in_the_traced_program(stock):
    pipe = stock[0].to("jax")
    try:
        lengths = hunyuan_video15._text_tokens(pipe)
        video = 3 * (32 // 8) * (48 // 8)  # latent frames x height x width (patch 1)
        seq = video + lengths
        assert not any(len(s) >= 2 and s[-2:] == (seq, seq) for s in _traced_shapes(pipe))
        # the control: the stock processor's dense [B, 1, S, S] mask shows up in the same inspection
        blocks = pipe.transformer.transformer_blocks
        for block in blocks:
            vars(block.attn)["processor"] = HunyuanVideo15AttnProcessor2_0()
        compiled_method(pipe, pipe.transformer).programs.clear()
        assert (1, 1, seq, seq) in _traced_shapes(pipe)
    finally:
        pipe.to("cpu")


def _random_inputs(transformer, image: bool, seed=0):
    g = torch.Generator().manual_seed(seed)
    config, batch = transformer.config, 3
    text, text_2, tokens = 7, 5, 4
    mask = torch.zeros(batch, text)
    mask_2 = torch.zeros(batch, text_2)
    for row, (n, n_2) in enumerate([(7, 0), (3, 5), (1, 2)]):  # full, none, partial
        mask[row, :n], mask_2[row, :n_2] = 1, 1
    image_embeds = (
        torch.randn(batch, tokens, config.image_embed_dim, generator=g)
        if image
        else torch.zeros(batch, tokens, config.image_embed_dim)
    )
    return dict(
        hidden_states=torch.randn(batch, config.in_channels, 2, 3, 4, generator=g),
        timestep=torch.tensor([900.0] * batch),
        encoder_hidden_states=torch.randn(batch, text, config.text_embed_dim, generator=g),
        encoder_attention_mask=mask,
        encoder_hidden_states_2=torch.randn(batch, text_2, config.text_embed_2_dim, generator=g),
        encoder_attention_mask_2=mask_2,
        image_embeds=image_embeds,
        return_dict=False,
    )


@pytest.mark.parametrize("image", [False, True], ids=["t2v", "i2v"])
def test_static_forward_equals_stock_forward_on_torch(image):
    """The gather along the stable argsort reproduces stock's boolean compaction exactly (plain torch)."""
    transformer = tiny.hunyuan15_pipeline().transformer
    inputs = _random_inputs(transformer, image)
    with torch.no_grad():
        expected = transformer(**inputs)[0]
        got = hunyuan_video15.forward(transformer, **inputs)[0]
        order, _ = hunyuan_video15.text_token_order(
            inputs["encoder_attention_mask"], inputs["encoder_attention_mask_2"], inputs["image_embeds"]
        )
        given = hunyuan_video15.forward(transformer, **inputs, token_order=order)[0]
    assert torch.isfinite(expected).all()
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)
    torch.testing.assert_close(given, got, rtol=0, atol=0)


def test_token_order_is_computed_once_per_prompt(stock, monkeypatch):
    pipe = stock[0].to("jax")
    try:
        generate(pipe, output_type="latent")  # compile
        calls = []
        order = hunyuan_video15.text_token_order
        monkeypatch.setattr(hunyuan_video15, "text_token_order", lambda *a: calls.append(1) or order(*a))
        generate(pipe, output_type="latent")  # 3 steps x (cond, uncond)
        assert len(calls) == 2
    finally:
        pipe.to("cpu")


def test_scheduler_never_looks_its_index_up(stock, monkeypatch):
    pipe = stock[0].to("jax")
    try:
        looked_up = []
        stock_lookup = pipe.scheduler.index_for_timestep
        monkeypatch.setattr(
            pipe.scheduler, "index_for_timestep", lambda *a, **k: looked_up.append(1) or stock_lookup(*a, **k)
        )
        generate(pipe, output_type="latent")
        assert looked_up == [] and pipe.scheduler.step_index == CALL["num_inference_steps"]
    finally:
        pipe.to("cpu")
    assert "set_timesteps" not in vars(pipe.scheduler)


def _dense(q, k, v, mask):
    logits = torch.einsum("bhqd,bhkd->bhqk", q, k) / q.shape[-1] ** 0.5
    return torch.einsum("bhqk,bhkd->bhqd", logits.masked_fill(~mask, float("-inf")).softmax(-1).nan_to_num(), v)


@pytest.mark.parametrize("attention", ["splash_exp2", "xla"])
def test_key_mask_processor_matches_stock_and_zeroes_padded_rows(attention):
    attn = tiny.hunyuan15_pipeline().transformer.transformer_blocks[1].attn
    g = torch.Generator().manual_seed(1)
    video, text = torch.randn(2, 6, 32, generator=g), torch.randn(2, 5, 32, generator=g)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 0, 0, 0, 0]], dtype=torch.bool)
    with torch.no_grad():
        expected = attn(video, text, attention_mask=mask)
    settings = diffusers_tpu.runtime.attention.sdpa.AttentionSettings(None, attention)
    weights = {name: backend.host_to_jax(value) for name, value in attn.state_dict().items()}

    def active():
        return contextlib_nested(backend.jax_mode(), diffusers_tpu.runtime.attention.sdpa.use(settings))

    for mode in ("mask", "zero_kv"):
        processor = hunyuan_video15.KeyMaskProcessor(mode)
        run = jit.CompiledFunction(
            attn, lambda h, e, m: processor(attn, h, e, attention_mask=m), state=lambda: weights, jax_context=active
        )
        got = user_tensors.to_host(run(video, text, mask))
        assert all(torch.isfinite(x).all() for x in got)
        if mode == "mask":
            torch.testing.assert_close(got[0], expected[0], rtol=0, atol=1e-5)
            torch.testing.assert_close(got[1], expected[1], rtol=0, atol=1e-5)
            # padded text rows attended nothing: their output is the projection of 0, i.e. its bias
            torch.testing.assert_close(got[1][1, 1:], attn.to_add_out.bias.detach().expand(4, -1), rtol=0, atol=1e-6)
        else:  # the approximation differs where text is padded
            assert (got[0] - expected[0]).abs().max() > 1e-4
    with pytest.raises(ValueError, match="text_padding"):
        hunyuan_video15.KeyMaskProcessor("zero")


def contextlib_nested(*managers):
    import contextlib

    stack = contextlib.ExitStack()
    for manager in managers:
        stack.enter_context(manager)
    return stack


def test_vae_frame_causal_mask_equals_stock():
    from diffusers.models.autoencoders.autoencoder_kl_hunyuanvideo15 import HunyuanVideo15AttnBlock

    for frames, hw in [(1, 4), (3, 6), (4, 1)]:
        stock_mask = HunyuanVideo15AttnBlock.prepare_causal_attention_mask(
            frames, hw, torch.float32, "cpu", batch_size=2
        )
        ours = hunyuan_video15.frame_causal_mask(frames, hw, torch.float32, "cpu", batch_size=2)
        assert ours.shape == stock_mask.shape[1:]
        assert torch.equal(ours.expand_as(stock_mask), stock_mask)


def test_vae_tiling_encode_and_batch_two_decode(stock):
    pipe = tiny.hunyuan15_pipeline()
    vae = pipe.vae
    g = torch.Generator().manual_seed(2)
    video = torch.rand(1, 3, 9, 32, 48, generator=g) * 2 - 1
    latents = torch.randn(2, 4, 3, 4, 6, generator=g)
    vae.enable_tiling(tile_sample_min_height=16, tile_sample_min_width=16, tile_overlap_factor=0.25)
    with torch.no_grad():
        tiled = vae.decode(latents[:1], return_dict=False)[0]
        vae.disable_tiling()
        encoded = vae.encode(video).latent_dist.mean
        each = torch.cat([vae.decode(z, return_dict=False)[0] for z in latents.split(1)])
    pipe.to("jax")
    try:
        with torch.no_grad():
            assert_np_matches(user_tensors.to_host(vae.encode(video).latent_dist.mean).numpy(), encoded.numpy())
            # stock decodes one latent at a time (batch 2 fails its mask broadcast); here both in one call
            assert_np_matches(user_tensors.to_host(vae.decode(latents, return_dict=False)[0]).numpy(), each.numpy())
            vae.enable_tiling(tile_sample_min_height=16, tile_sample_min_width=16, tile_overlap_factor=0.25)
            assert_np_matches(
                user_tensors.to_host(vae.decode(latents[:1], return_dict=False)[0]).numpy(), tiled.numpy()
            )
    finally:
        pipe.to("cpu")
    assert "prepare_causal_attention_mask" not in vars(vae.decoder.mid_block.attentions[0])


def test_text_encoders_on_jax_and_bf16_byt5(stock):
    pipe, reference = stock
    pipe.to("jax", config=TPUConfig(text_encoder="jax"))
    try:
        assert_np_matches(generate(pipe, output_type="np"), reference["np"])
    finally:
        pipe.to("cpu")
    steps = []
    pipe.to(
        "jax",
        config=TPUConfig(text_encoder="jax", dtype=torch.bfloat16, component_dtypes={"text_encoder_2": torch.bfloat16}),
    )
    try:
        assert pipe.text_encoder_2.shared.weight.dtype == torch.bfloat16 and pipe.text_encoder.dtype == torch.float32
        step = pipe.scheduler.step
        pipe.scheduler.step = lambda *a, **k: steps.append(step(*a, **k)) or steps[-1]
        out = generate(pipe, output_type="np")
    finally:
        vars(pipe.scheduler).pop("step", None)
        pipe.to("cpu")
    assert np.isfinite(out).all()
    assert [s[0].dtype for s in steps] == [torch.bfloat16] * CALL["num_inference_steps"]  # latents stay bf16


def test_byt5_bf16_is_the_tpu_default_only():
    family = hunyuan_video15.FAMILY
    tpu, cpu = backend.Target("tpu", "tpu"), backend.Target("jax", "cpu")
    assert decision.component_dtype(family, TPUConfig(), tpu, "text_encoder_2", None) is torch.bfloat16
    assert decision.component_dtype(family, TPUConfig(), tpu, "text_encoder", None) is None
    assert decision.component_dtype(family, TPUConfig(), cpu, "text_encoder_2", None) is None
    chosen = TPUConfig(component_dtypes={"text_encoder_2": torch.float32})
    assert decision.component_dtype(family, chosen, tpu, "text_encoder_2", None) is torch.float32
    with pytest.raises(ValueError, match="component_dtypes"):
        TPUConfig(component_dtypes={"text_encoder_2": "bf16"})
    with pytest.raises(ValueError, match="text_padding"):
        TPUConfig(text_padding="zeros")


def test_subclass_from_pretrained(tmp_path):
    tiny.hunyuan15_pipeline().save_pretrained(str(tmp_path), safe_serialization=True)
    loaded = diffusers_tpu.HunyuanVideo15Pipeline.from_pretrained(str(tmp_path))
    assert type(loaded) is diffusers_tpu.HunyuanVideo15Pipeline and isinstance(loaded, diffusers.HunyuanVideo15Pipeline)
    for name, value in tiny_hunyuan.HUNYUAN15_LENGTHS.items():
        setattr(loaded, name, value)
    reference = generate(loaded, output_type="np", num_inference_steps=2)
    loaded.to("jax")
    assert diffusers_tpu.sharding_of(loaded.transformer.transformer_blocks[0].attn.to_q.weight) is not None
    assert_np_matches(generate(loaded, output_type="np", num_inference_steps=2), reference)


@pytest.mark.slow
def test_cli_generates_with_guider_scale_and_staged(tmp_path):
    from tests.commands.test_cli import run_cli

    out = tmp_path / "hy.mp4"
    result = run_cli(
        "generate",
        "--model",
        "tiny:hunyuanvideo15",
        "--prompt",
        'a sign saying "hi"',
        "--guidance",
        "4",
        "--frames",
        "5",
        "--height",
        "32",
        "--width",
        "48",
        "--steps",
        "2",
        "--platform",
        "cpu",
        "--output",
        str(out),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "wrote 5 frames (48x32)" in result.stdout
    result = run_cli(
        "generate",
        "--model",
        "tiny:hunyuanvideo15",
        "--prompt",
        'a sign saying "hi"',
        "--guidance",
        "4",
        "--frames",
        "5",
        "--height",
        "32",
        "--width",
        "48",
        "--steps",
        "2",
        "--platform",
        "cpu",
        "--stage-dir",
        str(tmp_path / "stages"),
        "--output",
        str(tmp_path / "staged.mp4"),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    import imageio.v3 as iio

    np.testing.assert_array_equal(iio.imread(tmp_path / "staged.mp4"), iio.imread(out))  # staged == one shot


def test_guidance_scale_goes_to_the_guider():
    from diffusers_tpu.commands.pipeline_call import call_arguments

    pipe = tiny.hunyuan15_pipeline()
    call = call_arguments(pipe, dict(prompt="a", guidance_scale=3.5, max_sequence_length=None, num_frames=5))
    assert call == dict(prompt="a", num_frames=5) and pipe.guider.guidance_scale == 3.5


def test_a_guider_enabled_for_part_of_the_steps_runs_the_pair_then_the_single_program():
    """CFG for the first half of the schedule: those steps run the pair as one batch, the rest the single program
    (no wasted uncond half); both are compiled once (a warm-up builds them: the call after compiles nothing) and the
    video is stock's. A fresh guider per call, as stock needs (its step state outlives a call)."""
    call = dict(CALL, num_inference_steps=4, output_type="np")
    pipe = tiny.hunyuan15_pipeline()
    half = diffusers.ClassifierFreeGuidance(guidance_scale=6.0, stop=0.5)
    pipe.guider = half.new()
    reference = pipe(**call, generator=torch.Generator().manual_seed(0)).frames
    pipe.to("jax", config=TPUConfig(batch_cfg=True))
    try:
        runtime = pipeline_runtime.runtime_of(pipe)
        pipe.guider = half.new()
        diffusers_tpu.warm_up(
            pipe,
            [dict(height=call["height"], width=call["width"], num_frames=call["num_frames"])],
            **{k: v for k, v in call.items() if k not in ("height", "width", "num_frames")},
        )
        batches = []
        inner = runtime.chain(pipe.transformer).inner
        runtime.chain(pipe.transformer).inner = lambda *a, **k: (
            batches.append(k["hidden_states"].shape[0]) or inner(*a, **k)
        )
        pipe.guider = half.new()
        out = pipe(**call, generator=torch.Generator().manual_seed(0)).frames
        assert batches == [2, 2, 1, 1] and runtime.pairing.batched_steps == 2  # the pair, then the single program
        assert runtime.last_call.compilations == 0, runtime.last_call.summary()
        assert_np_matches(out, reference)
    finally:
        pipe.to("cpu")
