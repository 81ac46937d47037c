"""The project's exp2 flash ("splash") attention kernel for TPU, in Pallas.

Math: online softmax in base 2. The wrapper folds ``log2(e)`` into the query scaling, outside the kernel,
``q' = q * scale * log2(e)``, so ``softmax(q k^T * scale) = 2^(q' k^T - m) / sum 2^(q' k^T - m)``: the kernel
uses the TPU's native ``exp2`` for the probabilities and for the running-max correction ``2^(m_old - m_new)``,
accumulating in float32.

Layout (per grid step: one (batch*head, q block, kv block)): scores are computed key-major, ``s = k q'^T`` of shape
``[kv, q]``, so the softmax statistics ``m`` (running max) and ``row_sum`` are lane-dense ``[8, block_q]`` rows,
reductions run over sublanes, and the output accumulates transposed as ``[D, block_q]``. Each kv block is processed in
``block_kv_compute`` chunks (one matmul each), and each chunk's softmax update in ``block_kv_compute_in`` sub-blocks
(the fine-grained inner loop, keeping the elementwise work in registers).

Operands: with ``D`` a lane multiple (the real models' 128) q/k/v are read **packed**, ``[B, S, H*D]`` as the
projections lay them out (one head's ``[block, D]`` columns per grid step), and the output is written the same way
(the accumulator transposed once per query block): no transpose and no padding around the kernel; the last blocks
run past the sequences' ends (those keys are masked, those queries' rows not written). Heads narrower than a lane
tile (CogVideoX's and LTX's 64) are packed too when ``128 / D`` of them fill one: a grid step reads that group's
``[block, 128]`` columns, takes each head's scores against its own lanes of the query (the others zeroed: the MXU pads
a 64-deep contraction to its depth anyway) and its output rows from the transposed values' sublanes, with softmax
statistics per head. Otherwise heads are folded into rows, ``[B*H, S_pad, D]``, the sequences padded to block
multiples and the output written ``[B*H, D, S_pad]``.

Masking: keys past the sequence's end are recognised by position (only the chunk holding the end is masked);
``kv_mask`` marks valid keys per batch row, summarised per chunk in a scalar-prefetch table (none visible: skipped;
some: masked per key; all: no select); ``causal`` compares positions (block-causal with ``causal_block_size``).
Invisible keys get exactly zero weight and a query with no visible key returns 0.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from .blocks import _LANES, _SUBLANES, DEFAULT_VMEM_BYTES, BlockSizes, heads_per_block, round_up

LOG2E = math.log2(math.e)
MASK_VALUE = -0.7 * float(np.finfo(np.float32).max)  # finite: a fully masked chunk never makes inf - inf
# Positions and indices are non-negative, so truncating lax.div equals floor division; Python's ``//`` on traced
# ints lowers with a sign fix-up that Mosaic can only emit for a known chip generation.
_NT = (((1,), (1,)), ((), ()))  # k [kv, D] x q [q, D] -> [kv, q]
_TN = (((0,), (0,)), ((), ()))  # v [kv, D] x p [kv, q] -> [D, q]
_NN = (((1,), (0,)), ((), ()))  # v^T rows [D, kv] x p [kv, q] -> [D, q]


def _kernel(
    *refs,
    sizes: BlockSizes,
    kv_len: int,
    causal_block: int | None,
    q_offset: int,
    has_mask: bool,
    kv_padded: bool,
    kv_ragged: bool,
    packed: bool,
    heads: int,
    group: int,
    use_exp2: bool,
    precision,
):
    if has_mask:
        chunks_ref, q_ref, k_ref, v_ref, mask_ref, o_ref, m_ref, l_ref, acc_ref = refs
    else:
        q_ref, k_ref, v_ref, o_ref, m_ref, l_ref, acc_ref = refs
        mask_ref = None
    bq, bkv, compute, compute_in = sizes.block_q, sizes.block_kv, sizes.block_kv_compute, sizes.block_kv_compute_in
    exp = jnp.exp2 if use_exp2 else jnp.exp
    q_block, kv_block = pl.program_id(1), pl.program_id(2)
    batch_row = lax.div(pl.program_id(0), heads)  # (read here: interpret mode resolves program ids at the top level)

    @pl.when(kv_block == 0)
    def _init():
        m_ref[...] = jnp.full(m_ref.shape, MASK_VALUE, jnp.float32)
        l_ref[...] = jnp.zeros(l_ref.shape, jnp.float32)
        acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)

    dot = dict(precision=precision, preferred_element_type=jnp.float32)
    q = q_ref[...]
    head_dim = q.shape[1] // group
    if group > 1:  # one query per head of the group: its own lanes, the others zero
        lane_head = lax.div(lax.broadcasted_iota(jnp.int32, (1, q.shape[1]), 1), head_dim)
        queries = [jnp.where(lane_head == h, q, jnp.zeros_like(q)) for h in range(group)]
    else:
        queries = [q]
    q_first = q_offset + q_block * bq
    q_pos = q_first + lax.broadcasted_iota(jnp.int32, (1, bq), 1)

    def update(start, key_first, masked: bool):
        """One chunk's online-softmax update; ``masked``: some key of the chunk may be invisible. The heads of a
        packed group keep their statistics in sublanes ``8h .. 8h+7`` and their output in rows ``hD .. hD+D-1``."""
        keys = k_ref[pl.ds(start, compute), :]
        scores = [lax.dot_general(keys, query, _NT, **dot) for query in queries]
        rows = [pl.ds(h * _SUBLANES, _SUBLANES) for h in range(group)]
        dims = [pl.ds(h * head_dim, head_dim) for h in range(group)]
        state = [(m_ref[r, :], l_ref[r, :], acc_ref[d, :]) for r, d in zip(rows, dims)]
        for sub in range(compute // compute_in):  # the fine-grained inner loop
            offset = start + sub * compute_in
            if masked:
                key_pos = key_first + sub * compute_in + lax.broadcasted_iota(jnp.int32, (compute_in, 1), 0)
                visible = key_pos < kv_len
                if mask_ref is not None:
                    visible = jnp.logical_and(visible, mask_ref[pl.ds(offset, compute_in), :] != 0)
                if causal_block is not None:
                    visible = jnp.logical_and(visible, lax.div(key_pos, causal_block) <= lax.div(q_pos, causal_block))
            v = v_ref[pl.ds(offset, compute_in), :]
            if masked and kv_ragged:  # keys past the array's end are whatever the block read: 0 * NaN is NaN
                v = jnp.where(key_pos < kv_len, v, jnp.zeros_like(v))
            values_t = v.T if group > 1 else None  # each head's rows of it: sublane rows, no lane shuffle
            for h in range(group):
                m, row_sum, acc = state[h]
                s = scores[h][sub * compute_in : (sub + 1) * compute_in]
                if masked:
                    s = jnp.where(visible, s, MASK_VALUE)
                m_next = jnp.maximum(m, jnp.max(s, axis=0, keepdims=True))
                p = exp(s - m_next[0:1])
                if masked:  # a query that has seen no visible key yet has m_next == MASK_VALUE: exp(0) must not count
                    p = jnp.where(visible, p, 0.0)
                alpha = exp(m - m_next)
                row_sum = alpha * row_sum + jnp.sum(p, axis=0, keepdims=True)
                if group > 1:
                    pv = lax.dot_general(values_t[h * head_dim : (h + 1) * head_dim], p.astype(v.dtype), _NN, **dot)
                else:
                    pv = lax.dot_general(v, p.astype(v.dtype), _TN, **dot)
                state[h] = (m_next, row_sum, alpha[0:1] * acc + pv)
        for r, d, (m, row_sum, acc) in zip(rows, dims, state):
            m_ref[r, :], l_ref[r, :], acc_ref[d, :] = m, row_sum, acc

    def chunk(index, carry):
        start = index * compute
        key_first = kv_block * bkv + start
        needed = key_first < kv_len
        if causal_block is not None:
            needed = jnp.logical_and(
                needed, lax.div(key_first, causal_block) <= lax.div(q_first + bq - 1, causal_block)
            )
        if mask_ref is not None:  # the chunk's keys per the key mask (padding included): none, some or all visible
            visible = chunks_ref[batch_row, kv_block * (bkv // compute) + index]
            if causal_block is not None:
                pl.when(jnp.logical_and(needed, visible != _NO_KEY))(lambda: update(start, key_first, masked=True))
            else:
                pl.when(visible == _SOME_KEYS)(lambda: update(start, key_first, masked=True))
                pl.when(visible == _ALL_KEYS)(lambda: update(start, key_first, masked=False))
        elif causal_block is not None:
            pl.when(needed)(lambda: update(start, key_first, masked=True))
        elif kv_padded:  # only the chunk holding the end of the keys masks (padding); every other chunk is plain
            whole = key_first + compute <= kv_len
            pl.when(jnp.logical_and(needed, jnp.logical_not(whole)))(lambda: update(start, key_first, masked=True))
            pl.when(whole)(lambda: update(start, key_first, masked=False))
        else:  # no mask, no padding: no key is ever invisible, so no select is issued
            update(start, key_first, masked=False)
        return carry

    lax.fori_loop(0, bkv // compute, chunk, None)

    @pl.when(kv_block == pl.num_programs(2) - 1)
    def _finish():
        parts = []
        for h in range(group):
            total = l_ref[h * _SUBLANES : h * _SUBLANES + 1]
            inverse = jnp.where(total > 0, 1.0 / jnp.where(total > 0, total, 1.0), 0.0)
            parts.append(acc_ref[h * head_dim : (h + 1) * head_dim] * inverse)
        out = parts[0] if group == 1 else jnp.concatenate(parts, axis=0)
        o_ref[...] = (out.T if packed else out).astype(o_ref.dtype)  # packed: [block_q, D] rows of [B, S, H*D]


def _call(
    q,
    k,
    v,
    mask,
    *,
    heads: int,
    sizes: BlockSizes,
    kv_len: int,
    causal_block,
    q_offset: int,
    use_exp2: bool,
    interpret: bool,
    vmem_bytes: int,
    head_dim: int,
    packed: bool,
    group: int,
):
    """Folded: q [BH, Sq_pad, D], k/v [BH, Skv_pad, D] -> out [BH, D, Sq_pad]. Packed (``D`` a lane multiple, or
    ``group`` heads filling one): q [B, Sq, H*D], k/v [B, Skv, H*D] as the projections lay them out -> out
    [B, Sq, H*D], blocks of ``group * D`` columns read and written in place (a ragged last block past the sequence's
    end: its keys are masked, its queries' rows are not written). mask [B, Skv_pad, 1] or None."""
    bq, bkv = sizes.block_q, sizes.block_kv
    width = group * head_dim  # columns per grid step
    if packed:
        blocks = heads // group
        grid = (q.shape[0] * blocks, pl.cdiv(q.shape[1], bq), pl.cdiv(k.shape[1], bkv))
        q_index = lambda g, i, j, *_: (lax.div(g, blocks), i, lax.rem(g, blocks))  # noqa: E731
        kv_index = lambda g, i, j, *_: (lax.div(g, blocks), j, lax.rem(g, blocks))  # noqa: E731
        out_shape, out_block, out_index = q.shape, (None, bq, width), q_index
    else:
        batch_heads = q.shape[0]
        grid = (batch_heads, q.shape[1] // bq, k.shape[1] // bkv)
        q_index = lambda g, i, j, *_: (g, i, 0)  # noqa: E731
        kv_index = lambda g, i, j, *_: (g, j, 0)  # noqa: E731
        out_shape, out_block = (batch_heads, head_dim, q.shape[1]), (None, head_dim, bq)
        out_index = lambda g, i, j, *_: (g, 0, i)  # noqa: E731
    kv_rows = grid[2] * bkv
    in_specs = [
        pl.BlockSpec((None, bq, width), q_index),
        pl.BlockSpec((None, bkv, width), kv_index),
        pl.BlockSpec((None, bkv, width), kv_index),
    ]
    operands = [q, k, v]
    prefetch = []
    if mask is not None:
        in_specs.append(pl.BlockSpec((None, bkv, 1), lambda h, i, j, *_: (lax.div(h, heads // group), j, 0)))
        operands.append(mask)
        prefetch = [chunk_visibility(mask[..., 0], sizes.block_kv_compute)]
    precision = lax.Precision.HIGHEST if q.dtype == jnp.float32 else lax.Precision.DEFAULT
    kernel = functools.partial(
        _kernel,
        sizes=sizes,
        kv_len=kv_len,
        causal_block=causal_block,
        q_offset=q_offset,
        has_mask=mask is not None,
        kv_padded=kv_rows > kv_len,
        kv_ragged=kv_rows > k.shape[1],
        packed=packed,
        heads=heads // group,
        group=group,
        use_exp2=use_exp2,
        precision=precision,
    )
    params = None
    if not interpret:  # TPU only: megacore-parallel heads, the low-latency LLO scheduler, room for big blocks
        params = pltpu.CompilerParams(
            dimension_semantics=("parallel", "arbitrary", "arbitrary"),
            flags={"XLA_TPU_FORCE_LP_LLO_SCHEDULER": True},
            vmem_limit_bytes=min(max(2 * sizes.vmem_bytes(width, q.dtype.itemsize), 32 << 20), vmem_bytes),
        )
    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct(out_shape, q.dtype),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=len(prefetch),
            grid=grid,
            in_specs=in_specs,
            out_specs=pl.BlockSpec(out_block, out_index),
            scratch_shapes=[
                pltpu.VMEM((group * _SUBLANES, bq), jnp.float32),
                pltpu.VMEM((group * _SUBLANES, bq), jnp.float32),
                pltpu.VMEM((width, bq), jnp.float32),
            ],
        ),
        compiler_params=params,
        interpret=interpret,
        name="diffusers_tpu_flash_attention",
    )(*prefetch, *operands)


_NO_KEY, _SOME_KEYS, _ALL_KEYS = 0, 1, 2


def chunk_visibility(mask, compute: int):
    """Per batch row and chunk of ``compute`` keys: ``_NO_KEY`` visible (skipped), ``_SOME_KEYS`` (masked per key) or
    ``_ALL_KEYS`` (no select issued). mask: int ``[B, Skv_pad]`` (padding already 0). Read from SMEM per chunk."""
    chunks = mask.reshape(mask.shape[0], -1, compute) != 0
    return jnp.where(chunks.all(-1), _ALL_KEYS, jnp.where(chunks.any(-1), _SOME_KEYS, _NO_KEY)).astype(jnp.int32)


def smooth_keys(k, kv_mask=None):
    """Subtract the mean key (over valid keys): softmax is unchanged (it adds ``-q . mean`` to a whole row of
    logits), but logits shrink, which helps bf16."""
    keys = k.astype(jnp.float32)
    if kv_mask is None:
        mean = jnp.mean(keys, axis=2, keepdims=True)
    else:
        weights = kv_mask.astype(jnp.float32)[:, None, :, None]
        mean = jnp.sum(keys * weights, axis=2, keepdims=True) / jnp.maximum(jnp.sum(weights, axis=2, keepdims=True), 1)
    return (keys - mean).astype(k.dtype)


def flash_attention(
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
    vmem_bytes=None,
):
    """Attention on q ``[B, H, Sq, D]``, k/v ``[B, H, Skv, D]`` (f32 or bf16; f32 accumulation).

    Args:
        scale: logit scale, default ``D ** -0.5``.
        kv_mask: bool ``[B, Skv]``, True for keys that may be attended (per batch row).
        causal: query ``i`` (absolute position ``q_offset + i``) sees key ``j`` when
            ``j // causal_block_size <= (q_offset + i) // causal_block_size`` (block-causal; ``causal_block_size=1``
            with ``q_offset=0`` is torch's ``is_causal``).
        use_exp2: base-2 softmax with ``log2(e)`` folded into the query scaling (False: ``exp``, for comparison).
        block_sizes: ``BlockSizes`` (fitted to the sequences: ``BlockSizes.fit``).
        interpret: None = the real kernel when lowering for TPU, interpret mode elsewhere.
        k_smoothing: subtract the mean key first (exact for softmax; better bf16 numerics).
        vmem_bytes: VMEM of the TPU core it runs on (``vmem_capacity``; default ``DEFAULT_VMEM_BYTES``): blocks
            are shrunk to fit it and the kernel's VMEM limit never exceeds it.
    """
    batch, heads, q_len, head_dim = q.shape
    kv_len = k.shape[2]
    if q_offset < 0 or causal_block_size < 1:
        raise ValueError(
            f"flash_attention needs q_offset >= 0 and causal_block_size >= 1, got {q_offset}, {causal_block_size}."
        )
    scale = (head_dim**-0.5 if scale is None else scale) * (LOG2E if use_exp2 else 1.0)
    if k_smoothing:
        k = smooth_keys(k, kv_mask)
    vmem_bytes = vmem_bytes or DEFAULT_VMEM_BYTES
    group = heads_per_block(heads, head_dim)
    width = group * head_dim
    sizes = (block_sizes or BlockSizes()).fit(q_len, kv_len, width, q.dtype.itemsize, vmem_bytes)
    q_pad = round_up(q_len, sizes.block_q) - q_len
    kv_pad = round_up(kv_len, sizes.block_kv) - kv_len
    packed = width % _LANES == 0
    if packed:  # [B, S, H*D]: undoes the caller's [B, S, H, D] -> [B, H, S, D] transpose first (XLA cancels the pair)
        q3, k3, v3 = (jnp.swapaxes(x, 1, 2).reshape(batch, x.shape[2], heads * head_dim) for x in (q, k, v))
        q3 = (q3.astype(jnp.float32) * scale).astype(q3.dtype)
    else:  # heads folded into rows, sequences padded to block multiples
        q = (q.astype(jnp.float32) * scale).astype(q.dtype)
        fold = lambda x, pad: jnp.pad(x, ((0, 0), (0, 0), (0, pad), (0, 0))).reshape(batch * heads, -1, head_dim)  # noqa: E731
        q3, k3, v3 = fold(q, q_pad), fold(k, kv_pad), fold(v, kv_pad)
    mask = None
    if kv_mask is not None:
        mask = jnp.pad(kv_mask.astype(jnp.int32), ((0, 0), (0, kv_pad)))[:, :, None]
    run = functools.partial(
        _call,
        heads=heads,
        sizes=sizes,
        kv_len=kv_len,
        q_offset=q_offset,
        use_exp2=use_exp2,
        causal_block=causal_block_size if causal else None,
        vmem_bytes=vmem_bytes,
        head_dim=head_dim,
        packed=packed,
        group=group,
    )
    if interpret is None:
        out = lax.platform_dependent(
            q3,
            k3,
            v3,
            mask,
            tpu=functools.partial(run, interpret=False),
            default=functools.partial(run, interpret=True),
        )
    else:
        out = run(q3, k3, v3, mask, interpret=bool(interpret))
    if packed:
        return jnp.swapaxes(out.reshape(batch, q_len, heads, head_dim), 1, 2)
    out = out.reshape(batch, heads, head_dim, -1)[..., :q_len]
    return jnp.swapaxes(out, 2, 3)
