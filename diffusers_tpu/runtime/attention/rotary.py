"""Interleaved rotary embeddings on the mesh: torchax tensors -> ``kernels.rotary`` under ``shard_map``.

Inside a denoiser call whose attention runs the project's kernel (``sdpa.current_settings()`` is ``splash_exp2``), q and
k of shape ``[B, S, H, D]`` with tables ``[1, S, 1, D]`` go through the Pallas rotary kernel, each device rotating its
own batch rows, tokens and heads (sharded as the projections leave them: batch over dp, tokens over sp, heads over
tp). Everywhere else (XLA attention, cuDNN, calls outside a pipeline, other table shapes) the pure-jnp reference runs:
the same arithmetic as diffusers' own code.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from ...interop.backend import to_jax_array, wrap
from ...kernels.rotary import interleaved_rotary, rotary_reference
from . import sdpa


def rotate(*tensors, freqs_cos, freqs_sin, tables: str = "pairs"):
    """Each of ``tensors`` (torchax ``[B, S, H, D]``, one shape) rotated by ``freqs_cos``/``freqs_sin`` (``[S, D]``
    or ``[1, S, 1, D]``) under ``tables`` (``kernels.rotary``: "pairs" is Wan's rule, "lanes" diffusers'
    ``apply_rotary_emb``'s); returns torchax tensors of the inputs' dtype."""
    settings = sdpa.current_settings() or sdpa.SAFE
    arrays = tuple(to_jax_array(t) for t in tensors)
    cos, sin = to_jax_array(freqs_cos), to_jax_array(freqs_sin)
    if cos.ndim == 2:
        cos, sin = cos[None, :, None], sin[None, :, None]
    return tuple(wrap(a) for a in _rotate_jitted(arrays, cos, sin, tables=tables, settings=settings))


def _rotate(xs, cos, sin, *, tables: str = "pairs", settings: sdpa.AttentionSettings):
    batch, seq, heads, head_dim = xs[0].shape
    shared = cos.shape == (1, seq, 1, head_dim) and sin.shape == cos.shape and all(x.shape == xs[0].shape for x in xs)
    if settings.implementation != "splash_exp2" or not shared:
        return tuple(rotary_reference(x, cos, sin, tables) for x in xs)
    cos, sin = cos.reshape(seq, head_dim), sin.reshape(seq, head_dim)
    if settings.mesh is None:
        return interleaved_rotary(*xs, cos=cos, sin=sin, tables=tables)
    mesh = settings.mesh
    present = lambda axis, size: axis if axis in mesh.shape and size % mesh.shape[axis] == 0 else None  # noqa: E731
    dp, tp = present("dp", batch), present("tp", heads)
    sp = "sp" if "sp" in mesh.shape else None
    pad = -seq % mesh.shape[sp] if sp else 0
    if pad:  # every device takes an equal share of the tokens; the padding rows are dropped after
        xs = tuple(jnp.pad(x, ((0, 0), (0, pad), (0, 0), (0, 0))) for x in xs)
        cos, sin = (jnp.pad(t, ((0, pad), (0, 0))) for t in (cos, sin))
    x_spec, table_spec = P(dp, sp, tp, None), P(sp, None)
    body = lambda c, s, *x: interleaved_rotary(*x, cos=c, sin=s, tables=tables)  # noqa: E731
    out = jax.shard_map(
        body,
        mesh=mesh,
        in_specs=(table_spec, table_spec) + (x_spec,) * len(xs),
        out_specs=(x_spec,) * len(xs),
        check_vma=False,
    )(cos, sin, *xs)
    return tuple(o[:, :seq] for o in out) if pad else tuple(out)


_rotate_jitted = jax.jit(_rotate, static_argnames=("tables", "settings"))
