"""Pure-jnp attention: the numerical reference every kernel is tested against, and the dense-mask fallback."""

from __future__ import annotations

import jax.numpy as jnp


def _attend(q, k, v, scale, visible=None, bias=None):
    """Softmax(q k^T * scale + bias) v over visible keys, in float32; rows with no visible key give 0."""
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


def reference_attention(q, k, v, *, scale=None, kv_mask=None, causal=False, **_kernel_options):
    """Softmax attention on ``[B, H, Sq, D]`` queries and ``[B, H, Skv, D]`` keys/values.

    ``kv_mask``: bool ``[B, Skv]``, True for keys that may be attended. ``causal``: query i sees keys j <= i
    (torch's ``is_causal`` alignment). Accumulates in float32; a query row with no visible key returns 0.
    Kernel-only keyword arguments (block sizes, interpret) are accepted and ignored.
    """
    visible = None
    if causal:
        visible = jnp.tril(jnp.ones((q.shape[2], k.shape[2]), dtype=bool))[None, None]
    if kv_mask is not None:
        keys = kv_mask.astype(bool)[:, None, None, :]
        visible = keys if visible is None else visible & keys
    return _attend(q, k, v, scale, visible=visible)


def dense_mask_attention(q, k, v, *, mask, scale=None):
    """Attention with any boolean (True = attend) or additive float mask broadcastable to
    ``[B, H, Sq, Skv]``: the fallback for masks the kernels do not express. Fully masked rows return 0."""
    if mask.dtype == jnp.bool_:
        return _attend(q, k, v, scale, visible=mask)
    return _attend(q, k, v, scale, bias=mask)
