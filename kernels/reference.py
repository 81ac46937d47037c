"""Pure-jnp attention: the numerical reference every kernel is tested against, and the dense-mask fallback."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from .flash import smooth_keys

# logits one block of query rows may hold (512 MiB in float32): a longer attention runs its queries in blocks, each
# row's softmax exactly as whole — a VAE mid-block over 256x256 positions would otherwise hold 17 GB of logits twice
# (torch's CPU attention never materializes them)
ROW_BLOCK_LOGITS = 1 << 27


def _attend(q, k, v, scale, visible=None, bias=None):
    """Softmax(q k^T * scale + bias) v over visible keys, in float32; rows with no visible key give 0. Queries run
    in blocks of at most ``ROW_BLOCK_LOGITS`` logits (the same math per row)."""
    per_row = q.shape[0] * q.shape[1] * k.shape[2]
    rows = max(1, ROW_BLOCK_LOGITS // per_row)
    if q.shape[2] <= rows:
        return _attend_rows(q, k, v, scale, visible, bias)
    blocks = -(-q.shape[2] // rows)
    visible, bias = (
        m if m is None or m.ndim == 4 else m.reshape((1,) * (4 - m.ndim) + m.shape) for m in (visible, bias)
    )

    def in_blocks(x):  # [B, H, Sq, ...] -> [blocks, B, H, rows, ...], padded with zero rows
        x = jnp.pad(x, [(0, 0), (0, 0), (0, blocks * rows - x.shape[2])] + [(0, 0)] * (x.ndim - 3))
        return jnp.moveaxis(x.reshape(x.shape[:2] + (blocks, rows) + x.shape[3:]), 2, 0)

    def along_queries(mask):  # masks that vary by query row are cut with the queries; the others apply as they are
        return mask is not None and mask.ndim == 4 and mask.shape[2] == q.shape[2]

    per_block, whole = {"q": in_blocks(q)}, {}
    for name, mask in (("visible", visible), ("bias", bias)):
        if along_queries(mask):
            per_block[name] = in_blocks(jnp.broadcast_to(mask, mask.shape[:2] + (q.shape[2], k.shape[2])))
        else:
            whole[name] = mask

    def block(x):
        return _attend_rows(x["q"], k, v, scale, **whole, **{name: x[name] for name in x if name != "q"})

    out = jnp.moveaxis(jax.lax.map(block, per_block), 0, 2)
    return out.reshape(out.shape[:2] + (blocks * rows,) + out.shape[4:])[:, :, : q.shape[2]]


def _attend_rows(q, k, v, scale, visible=None, bias=None):
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    logits = jnp.einsum("bhqd,bhkd->bhqk", q.astype(jnp.float32), k.astype(jnp.float32)) * scale
    if bias is not None:
        logits = logits + bias.astype(jnp.float32)
        finite = jnp.isfinite(logits)
        visible = finite if visible is None else visible & finite
    if visible is not None:
        visible = jnp.broadcast_to(visible, logits.shape)
        logits = jnp.where(visible, logits, -jnp.inf)
    peak = jnp.max(logits, axis=-1, keepdims=True)
    peak = jnp.where(jnp.isfinite(peak), peak, 0.0)
    weights = jnp.exp(logits - peak)
    if visible is not None:
        weights = jnp.where(visible, weights, 0.0)
    total = jnp.sum(weights, axis=-1, keepdims=True)
    out = jnp.einsum("bhqk,bhkd->bhqd", weights, v.astype(jnp.float32))
    out = jnp.where(total > 0, out / jnp.where(total > 0, total, 1.0), 0.0)
    return out.astype(q.dtype)


def reference_attention(
    q,
    k,
    v,
    *,
    scale=None,
    kv_mask=None,
    causal=False,
    use_exp2=True,
    block_sizes=None,
    interpret=None,
    k_smoothing=False,
    causal_block_size=1,
    q_offset=0,
):
    """Softmax attention on ``[B, H, Sq, D]`` queries and ``[B, H, Skv, D]`` keys/values, with
    ``flash_attention``'s signature and semantics, in plain jnp (float32 accumulation).

    ``kv_mask``: bool ``[B, Skv]``, True for keys that may be attended. ``causal``: query ``i`` sees key ``j``
    when ``j // causal_block_size <= (q_offset + i) // causal_block_size`` (torch's ``is_causal`` with the
    defaults). A query row with no visible key returns 0. ``use_exp2``, ``block_sizes`` and ``interpret`` only
    concern the kernel; ``k_smoothing`` is exact, so applying it here checks that.
    """
    if k_smoothing:
        k = smooth_keys(k, kv_mask)
    visible = None
    if causal:
        queries = (q_offset + jnp.arange(q.shape[2]))[:, None] // causal_block_size
        keys = jnp.arange(k.shape[2])[None, :] // causal_block_size
        visible = (keys <= queries)[None, None]
    if kv_mask is not None:
        valid = kv_mask.astype(bool)[:, None, None, :]
        visible = valid if visible is None else visible & valid
    return _attend(q, k, v, scale, visible=visible)


def dense_mask_attention(q, k, v, *, mask, scale=None):
    """Attention with any boolean (True = attend) or additive float mask broadcastable to
    ``[B, H, Sq, Skv]``: the fallback for masks the kernels do not express. Fully masked rows return 0."""
    if mask.dtype == jnp.bool_:
        return _attend(q, k, v, scale, visible=mask)
    return _attend(q, k, v, scale, bias=mask)
