"""TPU lowering proven on a CPU machine: jax.export for platforms=["tpu"] runs the real Pallas -> Mosaic
lowering and rejects what a TPU cannot take."""

import jax
import jax.numpy as jnp
import pytest
import torch
from diffusers import AutoencoderKLWan, WanTransformer3DModel

from diffusers_tpu.families import wan
from diffusers_tpu.interop import backend
from diffusers_tpu.planner import lowering
from diffusers_tpu.planner.lowering import abstract
from diffusers_tpu.testing import tiny


@pytest.fixture(scope="module")
def mesh():
    return backend.build_mesh({"dp": 1, "sp": 1, "tp": 1}, jax.devices()[:1])


def step_inputs(mesh, batch, frames, height, width, text_len, text_dim, dtype):
    return dict(
        hidden_states=abstract((batch, 16, frames, height, width), dtype, mesh, ("dp",)),
        timestep=abstract((batch,), jnp.float32, mesh, ("dp",)),
        encoder_hidden_states=abstract((batch, text_len, text_dim), dtype, mesh, ("dp",)),
        return_dict=False,
    )


@pytest.mark.parametrize("variant", ["wan", "wan-4head"])
def test_tiny_transformer_step_lowers_with_the_pallas_kernel(mesh, variant):
    transformer = tiny.wan_pipeline(variant).transformer
    inputs = step_inputs(mesh, 2, 3, 4, 4, 512, 32, jnp.float32)
    exported = lowering.export_method(transformer, "forward", kwargs=inputs, mesh=mesh, rules=wan.SHARD_RULES)
    assert exported.platforms == ("tpu",)
    assert lowering.uses_pallas_kernel(exported)
    assert [a.shape for a in exported.out_avals] == [(2, 16, 3, 4, 4)]


def test_xla_attention_lowers_without_pallas(mesh):
    transformer = tiny.wan_pipeline("wan").transformer
    inputs = step_inputs(mesh, 1, 3, 4, 4, 512, 32, jnp.float32)
    exported = lowering.export_method(transformer, "forward", kwargs=inputs, mesh=mesh, attention_impl="xla")
    assert not lowering.uses_pallas_kernel(exported)


def test_tiny_vae_decode_and_postprocess_lower(mesh):
    vae = tiny.wan_pipeline("wan").vae
    exported = lowering.export_method(
        vae,
        "decode",
        (abstract((1, 16, 3, 4, 4), jnp.float32, mesh),),
        dict(return_dict=False),
        mesh=mesh,
        attention_impl=None,
    )
    assert [a.shape for a in exported.out_avals] == [(1, 3, 9, 32, 32)]
    post = lowering.export_postprocess(jax.ShapeDtypeStruct((1, 3, 9, 32, 32), jnp.float32))
    assert [(a.shape, a.dtype) for a in post.out_avals] == [((1, 9, 32, 32, 3), jnp.uint8)]


def test_wan_1_3b_at_480p_lowers_for_tpu(mesh):
    with torch.device("meta"):  # no weights exist: the architecture alone
        transformer = WanTransformer3DModel(**wan.WAN21_1_3B)
        vae = AutoencoderKLWan()
    inputs = step_inputs(mesh, 2, 21, 60, 104, 512, 4096, jnp.bfloat16)  # 81 frames, 480x832
    step = lowering.export_method(
        transformer, "forward", kwargs=inputs, mesh=mesh, rules=wan.SHARD_RULES, dtype=torch.bfloat16
    )
    assert lowering.uses_pallas_kernel(step)
    assert [(a.shape, a.dtype) for a in step.out_avals] == [((2, 16, 21, 60, 104), jnp.bfloat16)]
    decode = lowering.export_method(
        vae,
        "decode",
        (abstract((1, 16, 3, 60, 104), jnp.float32, mesh),),
        dict(return_dict=False),
        mesh=mesh,
        attention_impl=None,
    )
    assert [a.shape for a in decode.out_avals] == [(1, 3, 9, 480, 832)]
    post = lowering.export_postprocess(jax.ShapeDtypeStruct((1, 3, 81, 480, 832), jnp.float32))
    assert [a.shape for a in post.out_avals] == [(1, 81, 480, 832, 3)]


def test_a_block_shape_a_tpu_cannot_take_is_rejected():
    """The export really runs Mosaic's checks: a kernel block that is neither a multiple of (8, 128) nor the
    full array dimension must fail to lower."""
    from jax.experimental import pallas as pl

    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] * 2

    def bad(x):
        spec = pl.BlockSpec((8, 100), lambda i: (0, i))
        return pl.pallas_call(
            kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(3,), in_specs=[spec], out_specs=spec
        )(x)

    with pytest.raises(Exception, match="divisible by 8 and 128"):
        jax.export.export(jax.jit(bad), platforms=["tpu"])(jax.ShapeDtypeStruct((8, 300), jnp.float32))


def test_bf16_denoiser_step_multiplies_in_bf16(mesh):
    """Guard for the bf16 step (issue 27): every token-wise product of the lowered Wan denoiser step (q/k/v/out
    projections, feed-forward, text projection, output head) takes bf16 operands — a float32 upcast of a bf16
    matmul (a stray ``.float()`` before a linear layer, a weight left in float32) runs it at a fraction of the
    matrix units' rate. Per-sample products of the modules stock keeps in float32 (``_keep_in_fp32_modules``: the
    time embedder, [batch, dim]) are stock's choice. Attention is the kernel's (a Mosaic call). Lowered for TPU: the
    same torch code traces the same products for a GPU (whose cuDNN attention cannot be lowered without one)."""
    import re

    transformer = tiny.wan_pipeline("wan").transformer
    inputs = step_inputs(mesh, 2, 3, 4, 4, 512, 32, jnp.bfloat16)
    exported = lowering.export_method(
        transformer, "forward", kwargs=inputs, mesh=mesh, rules=wan.SHARD_RULES, dtype=torch.bfloat16
    )
    products = [
        re.search(r":\s*\((.*?)\)\s*->\s*tensor<([0-9x]+)x", line)
        for line in exported.mlir_module().splitlines()
        if "stablehlo.dot_general" in line
    ]
    tokenwise = [m.group(1) for m in products if m.group(2).count("x") >= 2]  # [batch, tokens, features]
    assert len(tokenwise) >= 2 * 8 + 1  # q, k, v, out of both attentions and the feed-forward per block; the head
    upcast = [types for types in tokenwise if "f32>" in types]
    assert not upcast, upcast[:2]


def test_denoiser_step_has_no_scatter(mesh):
    """Guard for the GPU profile's finding (issue 27): Wan's rotary embedding writes q and k through strided slices
    (``out[..., 0::2] = ...``); lowered as scatters they were 120 kernels per forward of the real-size step on an
    H100. They must stay elementwise (``torchax_views.strided_set``)."""
    transformer = tiny.wan_pipeline("wan").transformer
    inputs = step_inputs(mesh, 1, 3, 4, 4, 512, 32, jnp.bfloat16)
    text = lowering.export_method(
        transformer, "forward", kwargs=inputs, mesh=mesh, rules=wan.SHARD_RULES, dtype=torch.bfloat16
    ).mlir_module()
    assert "stablehlo.scatter" not in text
    assert "stablehlo.pad" in text  # the strided writes are there, as pad-with-interior + select


def test_attention_is_traced_once_per_distinct_call(monkeypatch):
    """The denoiser's attention calls enter the program as one nested function per distinct call (shapes and
    settings), not one copy per block: Wan's self- and cross-attention are traced once each whatever the depth
    (lowering 60 copies was most of a real-size warm start's lowering time; BENCHMARKS "A restarted process")."""
    from diffusers_tpu.runtime.attention import sdpa

    traced = []
    stock = sdpa.attend
    monkeypatch.setattr(sdpa, "attend", lambda q, k, *a, **kw: traced.append(k.shape[2]) or stock(q, k, *a, **kw))
    sdpa._attention_jitted.clear_cache()  # what earlier tests in this process traced would be reused
    pipe = tiny.wan_pipeline("wan")
    assert len(pipe.transformer.blocks) >= 2
    pipe.to("jax")
    try:  # a size no other test uses, so its denoiser program is traced here
        pipe(
            prompt="a cat",
            negative_prompt="",
            height=80,
            width=16,
            num_frames=17,
            num_inference_steps=1,
            output_type="latent",
            generator=torch.Generator().manual_seed(0),
        )
    finally:
        pipe.to("cpu")
    assert len(traced) == len(set(traced)) == 2, traced  # self (video keys) and cross (text keys)
