"""NVIDIA GPUs: cuDNN fused attention through ``jax.nn.dot_product_attention``, behind the kernels' signature."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def cudnn_attention(q, k, v, *, scale=None, kv_mask=None, implementation="cudnn", **_kernel_options):
    """q ``[B, H, Sq, D]``, k/v ``[B, H, Skv, D]``. cuDNN takes half precision only: float32 inputs use JAX's XLA
    implementation instead (``implementation=None`` forces that everywhere, e.g. on CPU). A row with no valid key
    returns 0."""
    if q.dtype not in (jnp.bfloat16, jnp.float16):
        implementation = None
    layout = lambda x: jnp.swapaxes(x, 1, 2)  # noqa: E731  (JAX wants [B, S, H, D])
    mask = None if kv_mask is None else kv_mask.astype(bool)[:, None, None, :]
    out = jax.nn.dot_product_attention(
        layout(q), layout(k), layout(v), mask=mask, scale=scale, implementation=implementation
    )
    out = layout(out)
    if kv_mask is not None:
        out = jnp.where(jnp.any(kv_mask, axis=-1)[:, None, None, None], out, 0)
    return out.astype(q.dtype)
