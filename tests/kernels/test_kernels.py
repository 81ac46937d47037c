"""kernels/: JAX's splash kernel behind our signature, checked against the pure-jnp reference and torch."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from diffusers_tpu.kernels import SplashBlockSizes, dense_mask_attention, reference_attention, splash_attention


def qkv(batch, heads, q_len, kv_len, dim, dtype=jnp.float32, seed=0):
    rng = np.random.default_rng(seed)
    make = lambda s: jnp.asarray(rng.standard_normal(s), dtype)  # noqa: E731
    return make((batch, heads, q_len, dim)), make((batch, heads, kv_len, dim)), make((batch, heads, kv_len, dim))


def torch_sdpa(q, k, v, **kwargs):
    as_torch = lambda x: torch.from_numpy(np.array(x, np.float32))  # noqa: E731
    mask = kwargs.pop("attn_mask", None)
    if mask is not None:
        kwargs["attn_mask"] = torch.from_numpy(np.array(mask))
    return F.scaled_dot_product_attention(as_torch(q), as_torch(k), as_torch(v), **kwargs).numpy()


@pytest.mark.parametrize("q_len, kv_len", [(77, 200), (128, 128), (5, 512), (300, 13)])
def test_reference_matches_torch(q_len, kv_len):
    q, k, v = qkv(2, 3, q_len, kv_len, 16)
    valid = jnp.arange(kv_len)[None] < jnp.array([[kv_len // 2 + 1], [kv_len]])
    out = reference_attention(q, k, v, kv_mask=valid, scale=0.3)
    ref = torch_sdpa(q, k, v, attn_mask=np.asarray(valid)[:, None, None, :], scale=0.3)
    np.testing.assert_allclose(np.asarray(out), ref, atol=2e-6)
    causal = reference_attention(q[:, :, : min(q_len, kv_len)], k, v, causal=True)
    ref = torch_sdpa(q[:, :, : min(q_len, kv_len)], k, v, is_causal=True)
    np.testing.assert_allclose(np.asarray(causal), ref, atol=2e-6)


@pytest.mark.parametrize(
    "q_len, kv_len, heads, dim", [(77, 200, 3, 16), (256, 256, 2, 64), (9, 700, 1, 8), (640, 130, 4, 32)]
)
def test_splash_matches_reference_with_padding_and_key_masks(q_len, kv_len, heads, dim):
    q, k, v = qkv(2, heads, q_len, kv_len, dim)
    valid = jnp.arange(kv_len)[None] < jnp.array([[kv_len // 3 + 1], [kv_len - 1]])
    sizes = SplashBlockSizes(block_q=256, block_kv=256, block_kv_compute=128)
    out = jax.jit(lambda *a: splash_attention(*a, kv_mask=valid, scale=0.2, block_sizes=sizes))(q, k, v)
    ref = reference_attention(q, k, v, kv_mask=valid, scale=0.2)
    assert out.shape == q.shape and out.dtype == q.dtype
    np.testing.assert_allclose(np.asarray(out), np.asarray(ref), atol=5e-6)
    unmasked = jax.jit(splash_attention)(q, k, v)
    np.testing.assert_allclose(np.asarray(unmasked), np.asarray(reference_attention(q, k, v)), atol=5e-6)


def test_splash_bfloat16():
    q, k, v = qkv(1, 2, 200, 300, 64, dtype=jnp.bfloat16)
    out = jax.jit(splash_attention)(q, k, v)
    ref = reference_attention(q.astype(jnp.float32), k.astype(jnp.float32), v.astype(jnp.float32))
    assert out.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(ref), atol=3e-2)


def test_rows_without_a_valid_key_are_zero_not_nan():
    q, k, v = qkv(2, 2, 40, 60, 8)
    valid = jnp.zeros((2, 60), bool).at[1, :7].set(True)
    for fn in (reference_attention, jax.jit(splash_attention)):
        out = np.asarray(fn(q, k, v, kv_mask=valid))
        assert np.isfinite(out).all() and not out[0].any()
        np.testing.assert_allclose(out[1], np.asarray(reference_attention(q, k, v, kv_mask=valid))[1], atol=5e-6)


def test_dense_masks_match_torch_and_fully_masked_rows_are_zero():
    q, k, v = qkv(2, 2, 16, 24, 8)
    rng = np.random.default_rng(1)
    bool_mask = rng.random((2, 1, 16, 24)) > 0.3
    bool_mask[0, 0, 3] = False  # a fully masked row
    out = np.asarray(dense_mask_attention(q, k, v, mask=jnp.asarray(bool_mask)))
    ref = torch_sdpa(q, k, v, attn_mask=bool_mask)
    rows = bool_mask.any(-1, keepdims=True).repeat(2, axis=1)
    np.testing.assert_allclose(np.where(rows, out, 0), np.where(rows, ref, 0), atol=2e-6)
    assert not out[0, :, 3].any() and np.isfinite(out).all()
    bias = rng.standard_normal((1, 2, 16, 24)).astype(np.float32)
    out = np.asarray(dense_mask_attention(q, k, v, mask=jnp.asarray(bias), scale=0.5))
    np.testing.assert_allclose(out, torch_sdpa(q, k, v, attn_mask=bias, scale=0.5), atol=2e-6)


@pytest.mark.parametrize("kwargs", [dict(block_q=100), dict(block_kv=0), dict(block_kv=256, block_kv_compute=384)])
def test_block_sizes_are_validated(kwargs):
    with pytest.raises(ValueError):
        SplashBlockSizes(**kwargs)


@pytest.mark.parametrize("mask", ["none", "keys", "causal", "dense bias"])
def test_reference_runs_long_attention_in_blocks_of_queries_exactly(monkeypatch, mask):
    """Past ``ROW_BLOCK_LOGITS`` the reference runs its queries in blocks (7 rows here): the same result, bit for bit,
    whatever the mask's shape."""
    from diffusers_tpu.kernels import reference

    q, k, v = qkv(2, 3, 300, 270, 16)
    valid = jnp.arange(270)[None] < jnp.array([[101], [270]])
    masks = {
        "none": {},
        "keys": {"kv_mask": valid},
        "causal": {"causal": True},
        "dense bias": {"mask": jnp.asarray(np.random.default_rng(1).standard_normal((3, 300, 270)), jnp.float32)},
    }[mask]
    attend = dense_mask_attention if mask == "dense bias" else reference_attention
    whole = attend(q, k, v, **masks)
    monkeypatch.setattr(reference, "ROW_BLOCK_LOGITS", 2 * 3 * 270 * 7)
    np.testing.assert_array_equal(attend(q, k, v, **masks), whole)


def test_a_vae_mid_block_attention_does_not_hold_all_its_logits():
    """One head over 256x256 positions (Qwen-Image's VAE encoding a 1024x1024 image in diffusers' tests): 17 GB of
    float32 logits if held whole — the CPU ran out of memory where torch did not; in blocks of queries, under 2 GB."""
    q = jax.ShapeDtypeStruct((1, 1, 65536, 96), jnp.float32)
    compiled = jax.jit(reference_attention).lower(q, q, q).compile()
    assert compiled.memory_analysis().temp_size_in_bytes < 2 << 30
