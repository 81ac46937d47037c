"""JAX's own Pallas splash-attention kernel behind the project's attention signature.

JAX's kernel takes one example at a time as ``[H, S, D]``, unscaled queries, sequence lengths that are block
multiples, and a static mask. This wrapper scales q, pads both sequences to block multiples, expresses the
per-batch key mask (and the padding) as segment ids, and vmaps over the batch. ``interpret=None`` resolves at
lowering time: the real Mosaic kernel when lowering for TPU, interpret mode anywhere else — so one traced
program runs on CPU in CI and exports for TPU unchanged.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as _splash
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as _masks

from .blocks import block_for, check_lane_multiples, round_up


@dataclasses.dataclass(frozen=True)
class SplashBlockSizes:
    """Tile sizes (multiples of 128); clamped to the padded sequence for short sequences."""

    block_q: int = 512
    block_kv: int = 1024
    block_kv_compute: int = 512

    def __post_init__(self):
        check_lane_multiples(self)  # segment-id blocks must be lane multiples
        if self.block_kv % self.block_kv_compute:
            raise ValueError(
                f"SplashBlockSizes.block_kv_compute={self.block_kv_compute} must divide block_kv={self.block_kv}."
            )


@functools.lru_cache(maxsize=64)
def _kernel(heads: int, q_len: int, kv_len: int, block_q: int, block_kv: int, block_kv_compute: int, interpret: bool):
    mask = _masks.MultiHeadMask([_masks.FullMask((q_len, kv_len))] * heads)
    sizes = _splash.BlockSizes(block_q=block_q, block_kv=block_kv, block_kv_compute=block_kv_compute)
    # Concrete mask tables even when first built inside a trace, so the cached kernel never holds a tracer.
    with jax.ensure_compile_time_eval():
        return _splash.make_splash_mha(mask, block_sizes=sizes, head_shards=1, q_seq_shards=1, interpret=interpret)


def _run(q, k, v, kv_valid, blocks: tuple[int, int, int], interpret: bool):
    batch, heads, q_len, _ = q.shape
    kernel = _kernel(heads, q_len, k.shape[2], *blocks, interpret)
    q_ids = jnp.zeros((batch, q_len), jnp.int32)
    kv_ids = jnp.where(kv_valid, 0, 1).astype(jnp.int32)  # padding and masked keys: another segment

    def one(q1, k1, v1, q_seg, kv_seg):
        return kernel(q1, k1, v1, segment_ids=_splash.SegmentIds(q=q_seg, kv=kv_seg))

    return jax.vmap(one)(q, k, v, q_ids, kv_ids)


def splash_attention(q, k, v, *, scale=None, kv_mask=None, block_sizes: SplashBlockSizes | None = None, interpret=None):
    """Attention with JAX's splash kernel. q ``[B, H, Sq, D]``, k/v ``[B, H, Skv, D]``, kv_mask bool ``[B, Skv]``.

    Masked keys get zero weight; a batch row with no valid key returns 0.
    """
    sizes = block_sizes or SplashBlockSizes()
    batch, _, q_len, head_dim = q.shape
    kv_len = k.shape[2]
    scale = head_dim**-0.5 if scale is None else scale
    block_q = block_for(q_len, sizes.block_q)
    block_kv = block_for(kv_len, sizes.block_kv)
    block_kv_compute = min(sizes.block_kv_compute, block_kv)
    if block_kv % block_kv_compute:
        block_kv_compute = block_kv
    q_pad, kv_pad = round_up(q_len, block_q) - q_len, round_up(kv_len, block_kv) - kv_len

    valid = jnp.ones((batch, kv_len), bool) if kv_mask is None else kv_mask.astype(bool)
    q = jnp.pad(q * jnp.asarray(scale, q.dtype), ((0, 0), (0, 0), (0, q_pad), (0, 0)))
    k = jnp.pad(k, ((0, 0), (0, 0), (0, kv_pad), (0, 0)))
    v = jnp.pad(v, ((0, 0), (0, 0), (0, kv_pad), (0, 0)))
    valid_padded = jnp.pad(valid, ((0, 0), (0, kv_pad)))
    blocks = (block_q, block_kv, block_kv_compute)

    if interpret is None:
        out = jax.lax.platform_dependent(
            q,
            k,
            v,
            valid_padded,
            tpu=functools.partial(_run, blocks=blocks, interpret=False),
            default=functools.partial(_run, blocks=blocks, interpret=True),
        )
    else:
        out = _run(q, k, v, valid_padded, blocks, bool(interpret))
    out = out[:, :, :q_len]
    any_valid = jnp.any(valid, axis=-1)[:, None, None, None]
    return jnp.where(any_valid, out, 0).astype(q.dtype)
