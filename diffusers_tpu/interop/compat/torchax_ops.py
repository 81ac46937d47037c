"""torchax's ops made to give torch's results (each section headed by what it does): random draws outside a program from
torch's generators, aten ops torchax does not lower, group norm run eagerly, zero-dim type promotion. Each patch with
its reason and guard; ``torchax_tensors.apply`` applies them in order."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import torch
import torchax
from torchax.ops import jaten, mappings, op_base, ops_registry
from torchax.tensor import Tensor

from .. import patching, torchax_private

# --- Random draws outside a program follow torch's generators ----------------------------------------------
# Reason: torchax draws ``torch.randn(..., device=jax)``, ``randn_like`` and ``normal_`` from its own key, so
# ``torch.manual_seed`` changes nothing and a CPU generator passed for a device draw gives the same values at every
# draw. Stock draws from torch's generators: a pipeline that samples ``latent_dist.sample()`` without a generator
# (I2VGen-XL) gave another video than stock's under the same seed (max-abs 0.1), and AnimateDiff's FreeNoise, whose
# ``torch.randperm(n, generator=g)`` names no device, shuffled its frames in another order (0.85). Outside a trace
# such draws are made by torch on the host (``host_scalars.draw``) and placed on the devices. The draws are never
# glue ops (torch tags them ``nondeterministic_seeded``), so this wrapper and the glue one (11) never both answer a
# call.
# Guard: a step of ``compat``'s one ``Environment.dispatch`` wrapper (0.0.10 - 0.0.13).


# --- aten ops torchax does not lower: window and frequency factories, in-place cumulative sums ----------------
# Reason: torchax has no lowering of aten's window factories (hann, hamming, blackman, bartlett, kaiser), of
# ``fft_fftfreq`` / ``fft_rfftfreq`` nor of ``cumsum_`` / ``cumprod_``; Kandinsky 6 SR (a Hann window blending its
# tiles, NABLA's ``vals.cumsum_(-1)``) and SeaCache's indicator (``torch.fft.fftfreq``) stopped with
# OperatorNotFound. The factories take no tensors: torch computes them on the host and they enter JAX as constants
# (stock's values). The in-place sums are torchax's functional ones written back (its ``InplaceOp``).
# Guard: registered only for overloads torchax does not lower itself (0.0.10 - 0.0.13 lower none of them).
_WINDOWS = ("hann_window", "hamming_window", "blackman_window", "bartlett_window", "kaiser_window")
_FACTORIES = (*_WINDOWS, "fft_fftfreq", "fft_rfftfreq")


def _host_window(overload):
    def window(*args, dtype=None, layout=None, device=None, pin_memory=None, requires_grad=False):
        if dtype is not None and not isinstance(dtype, torch.dtype):
            dtype = mappings.j2t_dtype(dtype)
        return jnp.asarray(overload(*args, dtype=dtype).numpy())

    return window


def patch_missing_ops():
    env = torchax.default_env()  # built already: its op table is a copy of the registry
    added = []

    def register(overload, implementation, **kind):
        if overload not in ops_registry.all_aten_ops:
            ops_registry.register_torch_dispatch_op(overload, implementation, **kind)
            torchax_private.op_table(env)[overload] = ops_registry.all_aten_ops[overload]
            added.append(overload)

    def undo():
        for overload in added:
            ops_registry.all_aten_ops.pop(overload, None)
            torchax_private.op_table(env).pop(overload, None)

    for name in _FACTORIES:
        packet = getattr(torch.ops.aten, name)
        for overload_name in packet.overloads():
            if not overload_name.endswith("out"):
                register(getattr(packet, overload_name), _host_window(getattr(packet, overload_name)))
    for inplace, functional in (
        (torch.ops.aten.cumsum_, torch.ops.aten.cumsum),
        (torch.ops.aten.cumprod_, torch.ops.aten.cumprod),
    ):
        register(inplace.default, op_base.InplaceOp(functional), is_jax_function=False, is_view_op=True)
    patching.record("window and frequency factories, in-place cumulative sums", undo)


# --- Group norm run eagerly ----------------------------------------------------------------------------------
# Reason: torchax 0.0.10-0.0.13 computes ``aten.native_group_norm`` with ``jax.lax.map`` over a function it defines
# anew on every call; outside a trace JAX wraps that map in a program keyed by the function, so every eager group
# norm compiled again (a UNet run eagerly while a pipeline's forward hooks are registered, as SAG's: 124 programs
# per call). Outside a trace it now runs as one program per shape, group count and epsilon; inside, unchanged.
# Guard: wraps the registered implementation once.
def patch_eager_group_norm():
    def make(stock):
        jitted = jax.jit(stock, static_argnums=(3, 4, 5, 6, 7))

        @functools.wraps(stock)
        def group_norm(input, weight, bias, N, C, HxW, group, eps=1e-5):
            traced = any(isinstance(x, jax.core.Tracer) for x in (input, weight, bias))
            return (stock if traced else jitted)(input, weight, bias, N, C, HxW, group, eps)

        return group_norm

    label = "group norm compiled once per shape when run eagerly"
    wrap_lowering("_aten_native_group_norm", torch.ops.aten.native_group_norm, make, label)


def wrap_lowering(lowering: str, op, make, label: str) -> None:
    """torchax's lowering ``jaten.<lowering>`` wrapped by ``make``, and the op table's entry for ``op`` pointed at the
    wrapper (the table holds the function itself, taken when torchax registered it)."""
    if patching.wrap(jaten, lowering, make, label):
        patching.wrap(ops_registry.all_aten_ops[op], "func", lambda registered: getattr(jaten, lowering), label)


# --- A zero-dim tensor does not widen a dimensioned operand -------------------------------------------------
# Reason: torch promotes across dimensioned operands only: a bfloat16 latent times a 0-dim float32 tensor (DDIM's
# ``alphas_cumprod[t] ** 0.5``) stays bfloat16. JAX promotes the two arrays to float32, so a bfloat16 pipeline whose
# scheduler does not cast back (DDIM, PNDM; flow matching does) fed float32 latents to its next step: Latte in
# bfloat16 failed ("Input type (float) and bias type (BFloat16)"), others silently left stock's dtype. The result of
# those elementwise ops is cast to the dtype torch gives (``torch.result_type`` of the operands' dtypes and ranks).
# Guard: a step of ``compat``'s one ``Environment.dispatch`` wrapper (0.0.10 - 0.0.13); acts only when a 0-dim and a
# dimensioned tensor meet.
_TWO_OPERANDS = {
    torch.ops.aten.add.Tensor,
    torch.ops.aten.sub.Tensor,
    torch.ops.aten.rsub.Tensor,
    torch.ops.aten.mul.Tensor,
    torch.ops.aten.div.Tensor,
    torch.ops.aten.div.Tensor_mode,
    torch.ops.aten.pow.Tensor_Tensor,
    torch.ops.aten.maximum.default,
    torch.ops.aten.minimum.default,
}


def _torch_result_dtype(operands):
    """The dtype torch gives two operands when one is a 0-dim tensor and the other is not, else None."""
    tensors = [x for x in operands if isinstance(x, torch.Tensor)]
    if len(tensors) != 2 or (tensors[0].ndim == 0) == (tensors[1].ndim == 0):
        return None
    stand_ins = [torch.empty((1,) * x.ndim, dtype=x.dtype, device="meta") for x in tensors]
    return torch.result_type(*stand_ins)


def promote_zero_dim(dispatch, env, func, types, args, kwargs, out):
    """``out`` of ``func`` in the dtype torch gives it when one operand is a 0-dim tensor (cast with ``dispatch``)."""
    if func in _TWO_OPERANDS or func is torch.ops.aten.where.self:
        operands = args[:2] if func in _TWO_OPERANDS else args[1:3]
        expected = _torch_result_dtype(operands)
        true_division = func is torch.ops.aten.div.Tensor or (
            func is torch.ops.aten.div.Tensor_mode and (kwargs or {}).get("rounding_mode") is None
        )
        if expected is not None and true_division and not (expected.is_floating_point or expected.is_complex):
            expected = torch.get_default_dtype()  # torch divides integers into floats
        if expected is not None and isinstance(out, Tensor) and out.dtype != expected:
            out = dispatch(env, torch.ops.aten._to_copy.default, types, (out,), {"dtype": expected})
    return out
