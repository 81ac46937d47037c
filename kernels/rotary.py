"""Interleaved rotary embeddings as a Pallas kernel for TPU, beside its pure-jnp reference.

Two rules for a pair of lanes ``(2i, 2i+1)`` of each head, both in float32 and rounded to ``x``'s dtype once:
- ``tables="pairs"`` (Wan's, ``transformer_wan.py``'s nested ``apply_rotary_emb``): one angle per pair, its cosine
  read from the even lane and its sine from the odd one: ``out[2i] = x[2i] cos[2i] - x[2i+1] sin[2i+1]``,
  ``out[2i+1] = x[2i] sin[2i+1] + x[2i+1] cos[2i]``.
- ``tables="lanes"`` (diffusers' ``embeddings.apply_rotary_emb`` with ``use_real_unbind_dim=-1``: HunyuanVideo,
  CogVideoX, Flux): each lane its own entry, ``out = x cos + rotated(x) sin`` with
  ``rotated(x)[2i] = -x[2i+1]``, ``rotated(x)[2i+1] = x[2i]``.

Why a kernel: written with pairs (``[..., D/2, 2]``), or with XLA's roll (slices of one lane), the TPU compiler
makes the sequence the minor dimension of q and k around the rotation and copies them there and back (4-6 layout
copies per Wan block at 480p). Here each head's ``[block, D]`` rows are read in the layout the projections write
(``[B, S, H*D]``), the partner lane comes from a lane rotation (``pltpu.roll``), and the result is written back in
the same layout: no copy. Which rotation brings lane ``j^1`` to lane ``j`` is read off a rotated iota, so nothing
depends on the rotation's direction convention.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from .blocks import _LANES, heads_per_block

BLOCK_ROWS = 512  # rows of one head per grid step: q, k, their outputs and both tables ~2 MB double-buffered


TABLES = ("pairs", "lanes")


def rotary_reference(x, cos, sin, tables: str = "pairs"):
    """The stock computation on ``x [..., S, H, D]`` with tables ``[S, D]`` (or anything broadcasting against
    ``[..., S, 1, D]``): pairs, float32 arithmetic, one rounding to ``x``'s dtype."""
    cos = jnp.asarray(cos, jnp.float32)
    sin = jnp.asarray(sin, jnp.float32)
    if cos.ndim == 2:
        cos, sin = cos[:, None], sin[:, None]
    pairs = x.astype(jnp.float32).reshape(x.shape[:-1] + (x.shape[-1] // 2, 2))
    x1, x2 = pairs[..., 0], pairs[..., 1]
    if tables == "lanes":
        rotated = jnp.stack([-x2, x1], axis=-1).reshape(x.shape)
        return (x.astype(jnp.float32) * cos + rotated * sin).astype(x.dtype)
    c, s = cos[..., 0::2], sin[..., 1::2]
    out = jnp.stack([x1 * c - x2 * s, x1 * s + x2 * c], axis=-1)
    return out.reshape(x.shape).astype(x.dtype)


def _from_partner(a, rolled_lanes, partner):
    """``a`` with each lane ``j`` holding ``a``'s lane ``j ^ 1``."""
    forward, backward = pltpu.roll(a, 1, 1), pltpu.roll(a, a.shape[-1] - 1, 1)
    return jnp.where(rolled_lanes == partner, forward, backward)


def _kernel(cos_ref, sin_ref, *refs, tables: str):
    count = len(refs) // 2
    lanes = lax.broadcasted_iota(jnp.int32, cos_ref.shape, 1)
    rolled_lanes, partner, even = pltpu.roll(lanes, 1, 1), lanes ^ 1, (lanes & 1) == 0
    cos, sin = cos_ref[...], sin_ref[...]
    if tables == "pairs":
        cos = jnp.where(even, cos, _from_partner(cos, rolled_lanes, partner))  # cos[2i] on both lanes of a pair
        signed_sin = jnp.where(even, -_from_partner(sin, rolled_lanes, partner), sin)  # -sin[2i+1], sin[2i+1]
    else:
        signed_sin = jnp.where(even, -sin, sin)
    for x_ref, o_ref in zip(refs[:count], refs[count:]):
        x = x_ref[...].astype(jnp.float32)
        o_ref[...] = (x * cos + _from_partner(x, rolled_lanes, partner) * signed_sin).astype(o_ref.dtype)


def _pallas_rotary(xs, cos, sin, *, heads: int, tables: str, interpret: bool, block_rows: int):
    batch, seq, width = xs[0].shape
    head_dim = width // heads
    rows = min(block_rows, seq)
    grid = (batch, pl.cdiv(seq, rows), heads)  # heads innermost: a table block is fetched once per row block
    x_spec = pl.BlockSpec((None, rows, head_dim), lambda b, s, h: (b, s, h))
    table_spec = pl.BlockSpec((rows, head_dim), lambda b, s, h: (s, 0))
    params = None
    if not interpret:
        params = pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "parallel"))
    return pl.pallas_call(
        functools.partial(_kernel, tables=tables),
        out_shape=tuple(jax.ShapeDtypeStruct(x.shape, x.dtype) for x in xs),
        grid=grid,
        in_specs=[table_spec, table_spec] + [x_spec] * len(xs),
        out_specs=tuple(x_spec for _ in xs),
        compiler_params=params,
        interpret=interpret,
        name="diffusers_tpu_rotary",
    )(cos, sin, *xs)


def kernel_applies(x, cos) -> bool:
    """Whether the kernel takes ``x [B, S, H, D]`` with tables ``cos [S, D]``: heads a lane multiple wide."""
    return x.ndim == 4 and x.shape[-1] % _LANES == 0 and cos.shape == (x.shape[1], x.shape[-1])


def interleaved_rotary(*xs, cos, sin, tables: str = "pairs", interpret=None, block_rows: int = BLOCK_ROWS):
    """Rotate each of ``xs`` (``[B, S, H, D]``, one shape) by tables ``cos``/``sin`` ``[S, D]`` (float32) under the
    rule ``tables`` (``TABLES``, see the module's docstring).

    ``interpret``: None = compiled when lowering for TPU, interpreted elsewhere; True/False force either. Shapes the
    kernel does not take (``kernel_applies``) use the reference."""
    if tables not in TABLES:
        raise ValueError(f"tables={tables!r}; choose one of {list(TABLES)}.")
    cos, sin = jnp.asarray(cos, jnp.float32), jnp.asarray(sin, jnp.float32)
    batch, seq, heads, head_dim = xs[0].shape
    group = heads_per_block(heads, head_dim)
    if group > 1 and cos.shape == (seq, head_dim):  # narrow heads side by side in a lane tile: tables per head
        packed = tuple(x.reshape(batch, seq, heads // group, group * head_dim) for x in xs)
        tiled = [jnp.tile(t, (1, group)) for t in (cos, sin)]
        out = interleaved_rotary(
            *packed, cos=tiled[0], sin=tiled[1], tables=tables, interpret=interpret, block_rows=block_rows
        )
        return tuple(o.reshape(xs[0].shape) for o in out)
    if not kernel_applies(xs[0], cos):
        return tuple(rotary_reference(x, cos, sin, tables) for x in xs)
    flat = tuple(x.reshape(batch, seq, heads * head_dim) for x in xs)
    run = functools.partial(_pallas_rotary, heads=heads, tables=tables, block_rows=block_rows)
    if interpret is None:  # as the attention kernel: compiled for TPU, interpreted elsewhere
        out = lax.platform_dependent(
            flat, cos, sin, tpu=functools.partial(run, interpret=False), default=functools.partial(run, interpret=True)
        )
    else:
        out = run(flat, cos, sin, interpret=bool(interpret))
    return tuple(o.reshape(batch, seq, heads, head_dim) for o in out)
