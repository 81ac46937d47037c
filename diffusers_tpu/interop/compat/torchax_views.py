"""torchax's views and indexing made to behave as torch's, a section each: indexing a view with a
tensor, in-place ops on views, schedule glue on the host, strided slice writes without a scatter, ``fill_diagonal_``.
Each patch with its reason and guard; ``compat.apply`` applies them in order."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import torch
import torchax
from torchax.tensor import Tensor
from torchax.view import NarrowInfo, View

from .. import host_scalars, patching, torchax_private


# --- Indexing a view with a tensor -----------------------------------------------------------------------
# Reason: torchax's ``__getitem__`` reads ``self._elem``, which its lazy ``View`` (what ``x[i]`` returns) does not
# have: ``embeddings[i][mask[i]]`` (Z-Image's prompt encoding) raised AttributeError. A view is materialized first.
# A scalar or vector indexed by tensors (a scheduler's table by a timestep) is read on the host (below).
# Guard: wraps the registered ``Tensor.__getitem__`` operator of the default environment (0.0.10 - 0.0.13) once.
def patch_view_getitem():
    operator = torchax_private.op_table(torchax.default_env()).get(torch.Tensor.__getitem__)
    if operator is None:
        return

    def make(stock):
        def getitem(self, indexes):
            # ``self`` may be a CPU tensor indexed by a device tensor (DDPM's ``alphas_cumprod[t]``): the default env
            env = torchax_private.environment_of(self) or torchax.default_env()
            if (found := host_scalars.getitem(env, self, indexes)) is not host_scalars.NOT_GLUE:
                return found
            return stock(self.torch() if isinstance(self, View) else self, indexes)

        return getitem

    patching.wrap(operator, "func", make, "torchax view indexing")


# --- In-place ops on a view -----------------------------------------------------------------------------
# Reason: torchax writes an in-place op's result back through a ``View`` (``out[..., :1, :]``) only for the ops in
# its own mutation table (``mul_``, ``add_``...); any other in-place op (``addcmul_``, ``addcdiv_``, ``lerp_``...)
# reaches its lowering with the view materialized as a copy, so the write is lost without a word. LTX-2's split
# rotary embedding does ``out[..., :1, :].addcmul_(...)``: its attention silently differed by 0.3. Every in-place
# op whose first argument is a view now runs on the materialized copy and writes the copy back through the view.
# Guard: a step of ``compat``'s one ``Environment.dispatch`` wrapper (0.0.10 - 0.0.13); ops torchax already handles on
# views pass through.
def _mutates_first_argument(func) -> bool:
    schema = getattr(func, "_schema", None)
    if schema is None or not schema.arguments or schema.arguments[0].kwarg_only:
        return False
    alias = schema.arguments[0].alias_info
    return alias is not None and alias.is_write


def written_through_view(env, func, args) -> bool:
    """Whether ``func`` writes its first argument, a view, in a way torchax's lowering would lose: the op then runs on
    the view's materialized copy, written back through the view (``compat``'s dispatch)."""
    if not (args and isinstance(args[0], View) and _mutates_first_argument(func)):
        return False
    try:
        return not torchax_private.op_or_decomposition(env, func).is_view_op
    except Exception:  # no lowering: let torchax raise its own error
        return False


# --- Scalars and vectors between programs are computed on the host ----------------------------------------
# Reason: every eager op on the devices is an XLA program of its own, compiled once per process, and pipelines run
# many such ops of schedule glue between their models. Ops whose tensors are all scalars or
# vectors run in torch on the host and their results are placed on the devices (``host_scalars`` says what qualifies).
# torchax views get their shape without running the slice, and a view of such a vector is read on the host.
# Guard: a step of ``compat``'s one ``Environment.dispatch`` wrapper; wraps ``NarrowInfo.calculate_output_shape`` and
# ``View.jax`` (0.0.10 - 0.0.13) once.
def patch_glue_views():

    shapes: dict = {}  # (source shape, dtype, the slice) -> the view's shape: a loop's views are the same each step

    def calculate_output_shape(self, source):
        key = _slice_key(self.slices)
        if key is None:
            return list(jax.eval_shape(self.transform_tensor, source).shape)
        key = (tuple(source.shape), str(source.dtype), key)
        if key not in shapes:
            shapes[key] = list(jax.eval_shape(self.transform_tensor, source).shape)
        return list(shapes[key])

    def view_jax(stock):
        def jax_array(self):
            array = host_scalars.view_on_host(self)
            return stock(self) if array is None else array

        return jax_array

    patching.wrap(
        NarrowInfo,
        "calculate_output_shape",
        lambda stock: calculate_output_shape,
        "torchax view shapes without running the slice",
    )
    patching.wrap(View, "jax", view_jax, "views of host scalars and vectors read on the host")


def _slice_key(slices):
    """A view's index as a hashable key (slices as their bounds), or None when it holds arrays."""
    parts = slices if isinstance(slices, tuple) else (slices,)
    key = []
    for part in parts:
        if isinstance(part, slice):
            key.append(("slice", part.start, part.stop, part.step))
        elif part is None or part is Ellipsis or type(part) is int:
            key.append(part)
        else:
            return None
    if any(not isinstance(v, (int, type(None))) for p in key if isinstance(p, tuple) for v in p[1:]):
        return None
    return tuple(key)


# --- Strided slice assignment without a scatter -------------------------------------------------------------
# Reason: torchax writes ``x[..., 0::2] = v`` (a view's write-back or ``__setitem__``) as ``x.at[slices].set(v)``,
# which JAX lowers to a scatter. Wan's rotary embedding writes q and k this way in every block: on an H100 the
# compiled Wan2.1-1.3B step held 120 scatter kernels per forward (48 GB of traffic) and the transposes feeding them.
# The same write as pad-with-interior + select is elementwise, fuses with the arithmetic that produces ``v``, and
# moves the same values (bit-identical). Contiguous slices keep ``.at[].set`` (a dynamic-update-slice already).
# Guard: wraps torchax's ``Tensor.__setitem__`` and ``NarrowInfo.update_tensor`` (0.0.10 - 0.0.13) once.
def strided_set(array: jax.Array, key, value) -> jax.Array | None:
    """``array.at[key].set(value)`` for a key of static slices (at least one with a step > 1) and at most one
    Ellipsis, as elementwise ops; None for any other key (the caller uses ``.at[].set``)."""
    key = key if isinstance(key, tuple) else (key,)
    if sum(k is Ellipsis for k in key) > 1 or not all(k is Ellipsis or isinstance(k, slice) for k in key):
        return None
    if any(
        isinstance(k, slice) and not all(p is None or isinstance(p, int) for p in (k.start, k.stop, k.step))
        for k in key
    ):
        return None
    fill = array.ndim - (len(key) - (Ellipsis in key))
    if fill < 0:
        return None
    slices = []
    for k in key:
        slices.extend([slice(None)] * fill if k is Ellipsis else [k])
    slices.extend([slice(None)] * (array.ndim - len(slices)))
    ranges = [range(*s.indices(n)) for s, n in zip(slices, array.shape)]
    if not any(r.step > 1 for r in ranges) or any(r.step < 1 for r in ranges):
        return None
    if any(len(r) == 0 for r in ranges):
        return array
    return _place_strided(array, value, tuple((r.start, r.stop, r.step) for r in ranges))


@functools.partial(jax.jit, static_argnums=2)  # one program per write shape when run eagerly, inlined in a trace
def _place_strided(array, value, ranges):
    ranges = tuple(range(*r) for r in ranges)
    value = jnp.broadcast_to(jnp.asarray(value).astype(array.dtype), tuple(len(r) for r in ranges))
    return _place(array, value, ranges)


def _place(array, value, ranges):
    """The write as data movement only: each strided axis is split into ``step`` phases (``[..., n/step, step]``),
    the written phase replaced (recursively, now with step 1 on that axis) and the phases interleaved back. On TPU
    this is a lane shuffle; the former pad-with-interior + select form, the same values, made 35 MB of TPU code and
    43 s of compile per Wan rotary write at 480p (measured with the TPU compiler, ``planner.tpu_compiler``)."""
    axis = next((a for a, r in enumerate(ranges) if r.step > 1), None)
    if axis is None:  # contiguous: an in-place dynamic-update-slice (whole-array writes are the value itself)
        if value.shape == array.shape:
            return value
        return jax.lax.dynamic_update_slice(array, value, tuple(r.start for r in ranges))
    r, n = ranges[axis], array.shape[axis]
    step, phase, first = r.step, r.start % r.step, r.start // r.step
    blocks = -(-n // step)
    padded = jnp.pad(array, [(0, blocks * step - n if a == axis else 0) for a in range(array.ndim)])
    split = padded.reshape(array.shape[:axis] + (blocks, step) + array.shape[axis + 1 :])
    phases = [jax.lax.index_in_dim(split, j, axis + 1, keepdims=False) for j in range(step)]
    inner = ranges[:axis] + (range(first, first + len(r)),) + ranges[axis + 1 :]
    phases[phase] = _place(phases[phase], value, inner)
    merged = jnp.stack(phases, axis=axis + 1).reshape(padded.shape)
    return jax.lax.slice_in_dim(merged, 0, n, axis=axis) if blocks * step != n else merged


def patch_strided_set():
    def setitem(stock):
        def __setitem__(self, key, value):
            jax_key, jax_value = torchax_private.environment_of(self).t2j_iso((key, value))
            if isinstance(jax_value, jax.Array):
                updated = strided_set(torchax_private.array(self), jax_key, jax_value)
                if updated is not None:
                    torchax_private.set_array(self, updated)
                    return
            stock(self, key, value)

        return __setitem__

    def update(stock):
        def update_tensor(self, new_value, jax_array):
            updated = strided_set(jax_array, self.slices, new_value)
            return stock(self, new_value, jax_array) if updated is None else updated

        return update_tensor

    patching.wrap(Tensor, "__setitem__", setitem, "strided slice assignment without scatter")
    patching.wrap(NarrowInfo, "update_tensor", update, "strided slice assignment without scatter (views)")


# --- torchax drops ``Tensor.fill_diagonal_`` --------------------------------------------------------------
# Reason: torchax has no lowering of ``fill_diagonal_``; torch decomposes it into ``as_strided(...).fill_()``, and
# torchax's ``as_strided`` is a copy, so the fill is lost without a word, on a tensor and on a view alike. Diffusers'
# perturbed-attention guidance (``PAGJointAttnProcessor2_0``: SD3 PAG) builds its identity mask with
# ``full_mask[:n, :n].fill_diagonal_(0)``; every perturbed image token then attended to nothing of its own and the
# images differed from stock by 4e-4. The patched method fills the diagonal functionally (torch's flat-step rule,
# ``wrap`` included) and writes it back with ``copy_``, which torchax carries through views.
# Guard: set on torchax's ``Tensor`` and ``View`` (0.0.10 - 0.0.13) when they do not define the method themselves.
def _fill_diagonal(array, value, wrap: bool):
    if array.ndim == 2:
        rows, cols = array.shape
        i, j = jnp.arange(rows)[:, None], jnp.arange(cols)[None, :]
        on = (i * cols + j) % (cols + 1) == 0 if wrap else i == j
    else:  # torch requires all dimensions equal: the main diagonal
        grids = jnp.indices(array.shape)
        on = jnp.all(grids == grids[0], axis=0)
    return jnp.where(on, jnp.asarray(value, array.dtype), array)


def patch_fill_diagonal():
    def fill_diagonal_(self, fill_value, wrap=False):
        filled = _fill_diagonal(self.jax() if isinstance(self, Tensor) else self.torch().jax(), fill_value, wrap)
        env = (
            torchax_private.environment_of(self)
            if isinstance(self, Tensor)
            else torchax_private.environment_of(self.torch())
        )
        self.copy_(Tensor(filled, env))
        return self

    for cls in (Tensor, View):
        current = vars(cls).get("fill_diagonal_")
        if current is not None and not patching.labels(current):
            return  # torchax implements it now
        patching.wrap(cls, "fill_diagonal_", lambda missing: fill_diagonal_, "torchax Tensor.fill_diagonal_")
