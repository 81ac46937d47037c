"""Attention on the mesh: torch's ``scaled_dot_product_attention`` → the configured kernel under ``shard_map``.

Model code keeps calling SDPA (diffusers' native dispatch, CogVideoX's processor, plain ``AttnProcessor2_0``);
that op is overridden on the torchax default environment (the one ``call_torch`` uses under jit) and routed
here. A denoiser's calls run the configured kernel under ``shard_map``; every other call (VAE mid-block, text
encoders, torchax code outside our pipelines) runs the exact reference, so no NaN row appears anywhere.

Sharding by key/value length (``TPUConfig.attention_kv_threshold``):
- long KV (self-attention over video tokens): batch over dp, heads over tp, query sequence over sp; each
  device sees all keys of its heads (XLA gathers K/V over sp).
- short KV (cross-attention to text): batch over dp, query sequence over sp and tp, K/V replicated.
Axes that do not divide a dimension are left out (that dimension is replicated); the query sequence is padded
to a multiple of its shard count.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from ...interop.backend import to_jax_array, wrap
from ...interop.compat import torchax_mesh, torchax_tensors
from ...interop.sharding import axis_size
from ...kernels import (
    BlockSizes,
    cudnn_attention,
    dense_mask_attention,
    flash_attention,
    reference_attention,
    splash_attention,
    vmem_capacity,
)

KERNELS = {
    "splash_exp2": flash_attention,
    "splash": splash_attention,
    "xla": reference_attention,
    "cudnn": cudnn_attention,
}


@dataclasses.dataclass(frozen=True)
class AttentionSettings:
    """How one module's attention runs. ``mesh=None``: no shard_map (XLA partitions it like any other op)."""

    mesh: Mesh | None
    implementation: str
    kv_threshold: int = 10000
    block_sizes: BlockSizes | None = None
    k_smoothing: bool = False

    def kernel(self, scale):
        options = {"scale": scale}
        if self.implementation == "splash_exp2":
            devices = self.mesh.devices.flat if self.mesh is not None else None
            options.update(
                block_sizes=self.block_sizes, k_smoothing=self.k_smoothing, vmem_bytes=vmem_capacity(devices)
            )
        return functools.partial(KERNELS[self.implementation], **options)


# Every attention call outside a denoiser (VAE mid-block, text encoders, anything outside a JAX pipeline call)
# runs the plain reference: exact, and a fully masked row gives 0, never NaN.
SAFE = AttentionSettings(mesh=None, implementation="xla")


_current: contextvars.ContextVar[AttentionSettings | None] = contextvars.ContextVar(
    "diffusers_tpu_attention", default=None
)


def current_settings() -> AttentionSettings | None:
    """The settings of the denoiser call being traced or run (None outside one)."""
    return _current.get()


@contextlib.contextmanager
def use(settings: AttentionSettings):
    token = _current.set(settings)
    try:
        yield
    finally:
        _current.reset(token)


def _fits(size: int, mesh: Mesh, axes) -> bool:
    return size % axis_size(axes, mesh.shape) == 0


def specs(q_shape, kv_len: int, settings: AttentionSettings):
    """(q/out spec, k/v spec, kv-mask spec, query-sequence axes) for one attention call."""
    batch, heads = q_shape[0], q_shape[1]
    mesh = settings.mesh
    dp = "dp" if _fits(batch, mesh, "dp") else None
    if kv_len >= settings.kv_threshold:
        tp = "tp" if _fits(heads, mesh, "tp") else None
        seq = "sp"
        return P(dp, tp, seq, None), P(dp, tp, None, None), P(dp, None), seq
    seq = ("sp", "tp")
    return P(dp, None, seq, None), P(dp, None, None, None), P(dp, None), seq


def attend(q, k, v, *, scale=None, kv_mask=None, settings: AttentionSettings, causal=False):
    """Kernel attention on JAX arrays ``[B, H, S, D]``, sharded over the settings' mesh."""
    kernel = settings.kernel(scale)
    if causal:
        kernel = functools.partial(kernel, causal=True)
    if settings.mesh is None:
        return kernel(q, k, v) if kv_mask is None else kernel(q, k, v, kv_mask=kv_mask)
    q_spec, kv_spec, mask_spec, seq_axes = specs(q.shape, k.shape[2], settings)
    q_len = q.shape[2]
    q = _rows_padded(q, axis_size(seq_axes, settings.mesh.shape))
    if kv_mask is None:
        body, in_specs, operands = kernel, (q_spec, kv_spec, kv_spec), (q, k, v)
    else:
        body = lambda q_, k_, v_, m_: kernel(q_, k_, v_, kv_mask=m_)  # noqa: E731
        in_specs, operands = (q_spec, kv_spec, kv_spec, mask_spec), (q, k, v, kv_mask)
    sharded = jax.shard_map(body, mesh=settings.mesh, in_specs=in_specs, out_specs=q_spec, check_vma=False)
    return sharded(*operands)[:, :, :q_len]


def _rows_padded(q, multiple: int):
    """``q`` with zero query rows appended up to a multiple of ``multiple`` (the shards of its sequence)."""
    pad = -q.shape[2] % multiple
    return jnp.pad(q, ((0, 0), (0, 0), (0, pad), (0, 0))) if pad else q


# The exact attention outside a denoiser, on a mesh: a VAE mid-block attends over every pixel of a frame (65,536
# queries in diffusers' Qwen-Image Edit test, 16,384 in the real model at 1024²). Left to XLA's partitioner, its
# video is gathered and every device computes every row (measured on 8 devices: each held the whole [S, S]
# logits); a large one runs its query rows split over all the mesh's devices instead, keys whole — each row the
# same math (float32 rounding apart, ~1e-6). Small ones stay whole: splitting them adds transfers for no work saved.
ROWS_SPLIT, _ROWS_SPLIT_LOGITS = "xla_rows_split", 1 << 22


def _rows_split_mesh(q):
    """The trace mesh when it has several devices and ``q`` is traced in a program on it or spread over its
    devices; else None."""
    mesh = torchax_mesh.trace_mesh()
    if mesh is None or mesh.size == 1:
        return None
    return mesh if isinstance(q, jax.core.Tracer) or len(q.sharding.device_set) == mesh.size else None


def _exact_rows_split(q, k, v, scale, kv_mask, causal, mesh):
    exact = functools.partial(reference_attention, scale=scale, causal=causal)
    if causal or q.shape[2] < mesh.size or q.shape[0] * q.shape[1] * q.shape[2] * k.shape[2] < _ROWS_SPLIT_LOGITS:
        return exact(q, k, v, kv_mask=kv_mask)
    rows = P(None, None, tuple(mesh.axis_names), None)
    operands = (_rows_padded(q, mesh.size), k, v) + (() if kv_mask is None else (kv_mask,))
    body = lambda q_, k_, v_, *m: exact(q_, k_, v_, kv_mask=m[0] if m else None)  # noqa: E731
    specs_in = (rows,) + (P(),) * (len(operands) - 1)
    out = jax.shard_map(body, mesh=mesh, in_specs=specs_in, out_specs=rows, check_vma=False)(*operands)
    return out[:, :, : q.shape[2]]


# Many tiny attentions — temporal attention over a few frames at every pixel (AnimateDiff's motion modules, SVD's
# temporal blocks: batch x pixels x heads problems of 16-25 tokens) — run as XLA's dense attention, which batches
# them in a few fused ops; the kernel would take one grid step per (batch, head) for a block of a few tokens.
_SHORT_TOKENS, _MANY_PROBLEMS = 128, 256


def _many_tiny(q, k) -> bool:
    return q.shape[2] <= _SHORT_TOKENS and k.shape[2] <= _SHORT_TOKENS and q.shape[0] * q.shape[1] >= _MANY_PROBLEMS


def _key_padding_mask(mask, batch: int, kv_len: int):
    """A bool mask that only varies along keys (and batch) as ``[B, Skv]``, else None."""
    if mask.dtype != jnp.bool_ or mask.ndim < 1 or mask.shape[-1] != kv_len:
        return None
    if mask.ndim >= 2 and mask.shape[-2] != 1 or mask.ndim >= 3 and mask.shape[-3] != 1:
        return None
    flat = mask.reshape(mask.shape[0] if mask.ndim == 4 else 1, kv_len)
    return jnp.broadcast_to(flat, (batch, kv_len))


def scaled_dot_product_attention(
    query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False
):
    """Drop-in for ``torch.nn.functional.scaled_dot_product_attention`` on torchax tensors."""
    if dropout_p:  # training-time dropout: torchax's own implementation has it
        return torchax_tensors.torchax_sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    settings = _current.get() or SAFE
    q, k, v = (to_jax_array(x) for x in (query, key, value))
    if settings is SAFE and (mesh := _rows_split_mesh(q)) is not None:
        settings = dataclasses.replace(SAFE, mesh=mesh, implementation=ROWS_SPLIT)
    mask = to_jax_array(attn_mask) if attn_mask is not None else None
    # Jitted in both modes. Eagerly (unit mode): one cached program per shape. Inside a traced program: JAX traces
    # and lowers one body per distinct call (Wan's 30 blocks make 2 distinct calls of 60) and XLA inlines it.
    return wrap(
        _attention_jitted(
            q, k, v, mask, scale=scale, is_causal=bool(is_causal), enable_gqa=bool(enable_gqa), settings=settings
        )
    )


def _attention(q, k, v, mask, *, scale, is_causal: bool, enable_gqa: bool, settings: AttentionSettings):
    lead = q.shape[:-2]
    if q.ndim != 4:  # torch accepts [..., L, E]: fold leading dims into the batch
        q, k, v = (x.reshape((-1, 1) + x.shape[-2:]) for x in (q, k, v))
    if enable_gqa and k.shape[1] != q.shape[1]:
        k, v = (jnp.repeat(x, q.shape[1] // x.shape[1], axis=1) for x in (k, v))
    kv_mask = _key_padding_mask(mask, q.shape[0], k.shape[2]) if mask is not None and q.ndim == 4 else None
    if k.shape[2] == 0:  # no keys at all (e.g. an empty image context): torch returns zeros
        out = jnp.zeros(q.shape[:-1] + v.shape[-1:], q.dtype)
    elif mask is not None and kv_mask is None:
        out = dense_mask_attention(q, k, v, mask=mask, scale=scale)
    elif settings.implementation == ROWS_SPLIT:
        out = _exact_rows_split(q, k, v, scale, kv_mask, is_causal, settings.mesh)
    elif settings.implementation == "splash_exp2" and _many_tiny(q, k):
        out = reference_attention(q, k, v, scale=scale, kv_mask=kv_mask, causal=is_causal)
    elif is_causal and settings.implementation == "splash_exp2":
        out = attend(
            q, k, v, scale=scale, kv_mask=kv_mask, settings=dataclasses.replace(settings, mesh=None), causal=True
        )
    elif is_causal:
        out = reference_attention(q, k, v, scale=scale, kv_mask=kv_mask, causal=True)
    else:
        out = attend(q, k, v, scale=scale, kv_mask=kv_mask, settings=settings)
    return out.reshape(lead + out.shape[-2:])


_attention_jitted = jax.jit(_attention, static_argnames=("scale", "is_causal", "enable_gqa", "settings"))
