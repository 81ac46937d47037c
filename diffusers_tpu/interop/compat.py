"""Compatibility of torchax with torch's semantics and JAX: the patches of torchax's behaviour the backend needs,
each with its reason and version guard, each set through ``patching.wrap``. The patches of torch itself (sections 1,
7 and 13 until they moved) are in ``torch_compat``; ``runtime/patches`` holds the diffusers-level hooks at the top.
This module imports nothing of the package but ``host_scalars`` and ``patching`` (all sit at the bottom of the import
graph). Over 400 lines on purpose: one numbered section per patch, so that every change the package makes to
torchax is read in one place.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import torch
import torch.nn.functional as F
import torchax
from jax.sharding import NamedSharding, PartitionSpec
from torchax.ops import jaten, mappings, op_base, ops_registry
from torchax.tensor import Environment, Tensor
from torchax.view import NarrowInfo, View

from . import host_scalars, jax_private, patching, torch_private, torchax_private
from .torch_private import pytree

# --- 2. SDPA on the torchax default environment -----------------------------------------------------------
# Reason: torchax's SDPA materializes the whole attention matrix, returns NaN for fully masked rows, and knows
# nothing about the mesh. Inside a JAX pipeline call the project's attention (kernel under shard_map) must run
# instead, for every caller: diffusers' native dispatch, processors calling F.scaled_dot_product_attention, and
# transformers' SDPA path. The override must sit on the *default* environment: ``interop.call_torch`` uses it
# under jit. Only calls with dropout (training) still reach torchax's original implementation.
# Guard: torchax keeps its op table in ``Environment._ops`` keyed by the torch callable (0.0.10 - 0.0.13).
_torchax_sdpa_op = None


def route_sdpa(scaled_dot_product_attention) -> None:
    """Route every SDPA call on the torchax default environment to ``scaled_dot_product_attention``."""
    global _torchax_sdpa_op

    environment = torchax.default_env()
    current = torchax_private.op_table(environment).get(F.scaled_dot_product_attention)
    if current is None or current.func is scaled_dot_product_attention:
        return
    _torchax_sdpa_op = current
    for op in (F.scaled_dot_product_attention, torch.ops.aten.scaled_dot_product_attention):
        environment.override_op_definition(op, scaled_dot_product_attention)
    patching.record("torchax SDPA override")


def torchax_sdpa(*args):
    """torchax's own SDPA (used outside JAX pipeline calls)."""
    return _torchax_sdpa_op.func(*args, env=torchax.default_env())


# --- 3. torchax Tensor.type_as returns a new tensor -------------------------------------------------------
# Reason: torchax's ``Tensor.type_as`` casts the wrapped JAX array *in place* and returns self. The wrapper's C++
# metadata (dtype fixed when the tensor was made) then disagrees with its ``.dtype`` property, and torch's own
# checks read the former: Wan's VAE ``WanUpsample`` (``interpolate(x.float()).type_as(x)``) then fails in the next
# conv with "Input type (float) and bias type (c10::BFloat16)" on bf16 weights. torch's ``type_as`` is not
# in-place; the patched one returns a new tensor of ``other``'s dtype, as torch does.
# Guard: only replaces torchax's own in-place implementation (0.0.10 - 0.0.13).
def _patch_type_as():
    current = vars(Tensor).get("type_as")
    if current is None or not patching.labels(current) and "self._elem = " not in inspect.getsource(current):
        return  # torchax has none, or a fixed one: nothing to do

    def type_as(self, other):
        if self.dtype == other.dtype:
            return self
        return Tensor(torchax_private.array(self).astype(other.jax().dtype), torchax_private.environment_of(self))

    patching.wrap(Tensor, "type_as", lambda stock: type_as, "torchax Tensor.type_as")


# --- 4. torchax Tensor.__setitem__ casts the value to the tensor's dtype ------------------------------------
# Reason: torch casts an assigned value to the destination's dtype; torchax hands both to ``.at[].set`` as they
# are, and JAX warns that mixing them (float32 into bfloat16) will become an error. Wan's rotary embedding does
# exactly that in bfloat16 (``out[..., 0::2] = x1 * cos - x2 * sin`` with float32 ``cos``). torch also drops a
# value's leading size-1 dimensions (``out[i] = x[i][None]``: Text2Video-Zero's warp), which JAX refuses to broadcast
# ("fewer dimensions"); without them broadcasting is the same.
# Guard: only wraps torchax's own ``__setitem__`` (0.0.10 - 0.0.13), once.
def _patch_setitem():
    if "__setitem__" not in vars(Tensor):
        return
    patching.wrap(Tensor, "__setitem__", _setitem_casting, "torchax Tensor.__setitem__")


def _setitem_casting(stock):
    def __setitem__(self, key, value):
        if isinstance(value, torch.Tensor) and value.dtype != self.dtype:
            value = value.to(self.dtype)
        elif isinstance(value, jax.Array) and value.dtype != torchax_private.array(self).dtype:
            value = value.astype(torchax_private.array(self).dtype)
        elif isinstance(value, (int, float)) and self.dtype == torch.bool:
            value = bool(value)  # torch: mask[:n] = 1 sets True (Z-Image's caption mask)
        if isinstance(value, (torch.Tensor, jax.Array)) and value.ndim and value.shape[0] == 1:
            shape = tuple(value.shape)
            while shape and shape[0] == 1:
                shape = shape[1:]
            value = value.reshape(shape)
        return stock(self, key, value)

    return __setitem__


# --- 5. copy.deepcopy of a torchax tensor -----------------------------------------------------------------
# Reason: torch's ``Tensor.__deepcopy__`` rebuilds storage (``aten::set_.source_Storage``), which torchax cannot
# lower; pipelines deepcopy their scheduler mid-call (SkyReels-V2 diffusion forcing: one scheduler per frame)
# while it holds device timesteps. A JAX array is immutable and torchax's in-place ops replace the wrapped
# array, so a new wrapper around the same array is a true deep copy.
# A view (torchax ``View``) is copied as the tensor it shows. A plain CPU tensor copied while the torchax modes are on
# (the same scheduler's host tables) is copied with the modes off: its storage copy would otherwise dispatch to
# torchax. Guard: only when torchax does not define its own ``__deepcopy__`` (0.0.10 - 0.0.13).
def _patch_deepcopy():
    if "__deepcopy__" in vars(Tensor):
        return

    def __deepcopy__(self, memo):
        array = self.jax() if isinstance(self, View) else torchax_private.array(self)
        copied = Tensor(
            array,
            torchax_private.environment_of(self)
            if isinstance(self, Tensor)
            else torchax_private.environment_of(self.torch()),
        )
        memo[id(self)] = copied
        return copied

    Tensor.__deepcopy__ = View.__deepcopy__ = __deepcopy__
    stock = torch.Tensor.__deepcopy__

    def host_deepcopy(self, memo):
        if self.device.type == "cpu" and not isinstance(self, (Tensor, View)):
            with torch_private.plain_torch():
                return stock(self, memo)
        return stock(self, memo)

    torch.Tensor.__deepcopy__ = host_deepcopy
    patching.record("torchax Tensor.__deepcopy__")


# --- 6. A host tensor mixed into a JAX op is moved, as torch moves a CPU index or scalar ------------------------
# Reason: pipeline code builds small tensors on the CPU (``torch.zeros(n, dtype=torch.long)`` without a device) and
# uses them with device tensors: ``device_table[cpu_index]`` works on CUDA, while torchax asserts "mixed math between
# XLATensor and torch.Tensor" (SkyReels-V2 diffusion forcing's timestep matrix). torchax already turns 0-d host
# tensors into scalars; other host tensors are now copied to JAX (inside a trace: constants).
# Guard: wraps torchax's ``Environment.t2j_iso`` (0.0.10 - 0.0.13) once; torchax tensors pass through untouched.
def _patch_mixed_host_tensors():
    def make(stock):
        def t2j_iso(self, torchtensors):
            def move(x):
                if isinstance(x, (Tensor, View)) or x.squeeze().ndim == 0 or x.device.type == "meta":
                    return x
                return Tensor(self.t2j_copy(x), self)

            return stock(self, pytree.tree_map_only(torch.Tensor, move, torchtensors))

        return t2j_iso

    patching.wrap(Environment, "t2j_iso", make, "torchax host tensors in JAX ops")


# --- 8. Indexing a view with a tensor -----------------------------------------------------------------------
# Reason: torchax's ``__getitem__`` reads ``self._elem``, which its lazy ``View`` (what ``x[i]`` returns) does not
# have: ``embeddings[i][mask[i]]`` (Z-Image's prompt encoding) raised AttributeError. A view is materialized first.
# A scalar or vector indexed by tensors (a scheduler's table by a timestep) is read on the host (patch 11).
# Guard: wraps the registered ``Tensor.__getitem__`` operator of the default environment (0.0.10 - 0.0.13) once.
def _patch_view_getitem():
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


# --- 9. In-place ops on a view -----------------------------------------------------------------------------
# Reason: torchax writes an in-place op's result back through a ``View`` (``out[..., :1, :]``) only for the ops in
# its own mutation table (``mul_``, ``add_``...); any other in-place op (``addcmul_``, ``addcdiv_``, ``lerp_``...)
# reaches its lowering with the view materialized as a copy, so the write is lost without a word. LTX-2's split
# rotary embedding does ``out[..., :1, :].addcmul_(...)``: its attention silently differed by 0.3. Every in-place
# op whose first argument is a view now runs on the materialized copy and writes the copy back through the view.
# Guard: wraps ``Environment.dispatch`` (0.0.10 - 0.0.13) once; ops torchax already handles on views pass through.
def _mutates_first_argument(func) -> bool:
    schema = getattr(func, "_schema", None)
    if schema is None or not schema.arguments or schema.arguments[0].kwarg_only:
        return False
    alias = schema.arguments[0].alias_info
    return alias is not None and alias.is_write


def _inplace_on_views(stock):
    def dispatch(self, func, types, args, kwargs):
        if args and isinstance(args[0], View) and _mutates_first_argument(func):
            try:
                handled = torchax_private.op_or_decomposition(self, func).is_view_op
            except Exception:  # no lowering: let torchax raise its own error
                handled = True
            if not handled:
                view, copy = args[0], args[0].torch()
                stock(self, func, types, (copy, *args[1:]), kwargs)
                view.update(copy)
                return view
        return stock(self, func, types, args, kwargs)

    return dispatch


# --- 10. Host tensors enter JAX without a program ------------------------------------------------------------
# Reason: torchax copies a CPU tensor with ``jnp.asarray``, which compiles a program (``stage``) per shape and dtype;
# ``jax.device_put`` is the same transfer without one. The copy keeps the array from sharing the tensor's memory
# (JAX on the CPU adopts aligned buffers). A move that also changes the dtype (``torch.from_numpy(t).to(device,
# torch.int64)``: every scheduler's ``set_timesteps``) casts on the host first: torchax cast on the devices, one more
# program. Guard: replaces ``torchax.ops.mappings.t2j`` (0.0.10 - 0.0.13) for CPU tensors without DLPack (bfloat16
# goes through its bits: numpy has no bfloat16 of its own), and wraps ``Environment._to_copy`` for plain CPU tensors.
def _patch_host_transfers():
    def make(stock):
        def t2j(tensor, use_dlpack=True):
            if use_dlpack or tensor.device.type != "cpu" or tensor.layout != torch.strided:
                return stock(tensor, use_dlpack)

            return jax.device_put(host_scalars.host_numpy(tensor))

        return t2j

    def make_to_copy(stock):
        def _to_copy(self, the_tensor, new_dtype, new_device):
            moving = type(the_tensor) is torch.Tensor and the_tensor.device.type == "cpu"
            if moving and new_dtype is not None and new_dtype != the_tensor.dtype and new_device is not None:
                if torchax_private.routes_to_jax(self, new_device):
                    with torch_private.plain_torch():
                        the_tensor = the_tensor.to(new_dtype)
                    new_dtype = mappings.j2t_dtype(jax.dtypes.canonicalize_dtype(mappings.t2j_dtype(new_dtype)))
            return stock(self, the_tensor, new_dtype, new_device)

        return _to_copy

    patching.wrap(mappings, "t2j", make, "torchax host transfers")
    patching.wrap(Environment, "_to_copy", make_to_copy, "torchax host transfers cast on the host")


# --- 11. Scalars and vectors between programs are computed on the host ----------------------------------------
# Reason: every eager op on the devices is an XLA program of its own, compiled once per process, and pipelines run
# many such ops of schedule glue between their models. Ops whose tensors are all scalars or
# vectors run in torch on the host and their results are placed on the devices (``host_scalars`` says what qualifies).
# torchax views get their shape without running the slice, and a view of such a vector is read on the host.
# Guard: wraps ``Environment.dispatch``, ``NarrowInfo.calculate_output_shape`` and ``View.jax`` (0.0.10 - 0.0.13) once.
def _glue_on_host(stock):
    def dispatch(self, func, types, args, kwargs):
        result = host_scalars.run(self, func, args, kwargs or {})
        return stock(self, func, types, args, kwargs) if result is host_scalars.NOT_GLUE else result

    return dispatch


def _patch_glue_views():

    def calculate_output_shape(self, source):
        return list(jax.eval_shape(self.transform_tensor, source).shape)

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


# --- 12. Strided slice assignment without a scatter -------------------------------------------------------------
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


def _patch_strided_set():
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


# --- 14. torchax drops ``Tensor.fill_diagonal_`` --------------------------------------------------------------
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


def _patch_fill_diagonal():
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


# --- 15. Random draws outside a program follow torch's generators ----------------------------------------------
# Reason: torchax draws ``torch.randn(..., device=jax)``, ``randn_like`` and ``normal_`` from its own key, so
# ``torch.manual_seed`` changes nothing and a CPU generator passed for a device draw gives the same values at every
# draw. Stock draws from torch's generators: a pipeline that samples ``latent_dist.sample()`` without a generator
# (I2VGen-XL) gave another video than stock's under the same seed (max-abs 0.1), and AnimateDiff's FreeNoise, whose
# ``torch.randperm(n, generator=g)`` names no device, shuffled its frames in another order (0.85). Outside a trace
# such draws are made by torch on the host (``host_scalars.draw``) and placed on the devices. The draws are never
# glue ops (torch tags them ``nondeterministic_seeded``), so this wrapper and the glue one (11) never both answer a
# call.
# Guard: wraps ``Environment.dispatch`` (0.0.10 - 0.0.13) once.
def _random_draws(stock):
    def dispatch(self, func, types, args, kwargs):
        if func in host_scalars.RANDOM_DRAWS:
            drawn = host_scalars.draw(self, func, args, kwargs or {})
            if drawn is not host_scalars.NOT_GLUE:
                return drawn
        return stock(self, func, types, args, kwargs)

    return dispatch


# --- 16. Convolutions never split a small spatial dimension over the mesh ---------------------------------------
# Reason: XLA's SPMD partitioner (jax/jaxlib 0.10.2) computes a convolution wrongly when its input is split along a
# spatial dimension into parts no longer than the kernel (measured on XLA:CPU with plain ``jax.jit``: a 3x3 conv of
# a 4-row input split over 2 devices, a 4x4 stride-2 conv of 6 or 8 rows, 7x7 up to 6 rows a part; off by up to
# 1e2, no error; 102 of 3,136 shapes, none with parts longer than the kernel). Attention hands a UNet's image
# tokens back split over sp/tp; at a UNet's deepest, smallest levels the next convolution then fell in that zone
# (the latent x2 upscaler's K-UNet differed from stock by 0.27 on dp2·tp2). Inside the runtime's programs
# (``mesh_of_traces``) a convolution's input is constrained to keep whole every spatial dimension shorter than
# 2 x kernel x devices; batch, channels and long dimensions stay free. The partitioner is shared by all backends.
# Guard: wraps torchax's ``aten.convolution`` lowering (``aten.conv2d`` calls it) once, for torchax 0.0.10 - 0.0.13.
_trace_mesh: contextvars.ContextVar = contextvars.ContextVar("diffusers_tpu_trace_mesh", default=None)


@contextlib.contextmanager
def mesh_of_traces(mesh):
    """The mesh that programs traced in this context run on (None: one device)."""
    token = _trace_mesh.set(mesh)
    try:
        yield
    finally:
        _trace_mesh.reset(token)


def trace_mesh():
    """The mesh of ``mesh_of_traces`` (None outside one)."""
    return _trace_mesh.get()


def whole_small_spatial_dims(array, kernel):
    """``array`` ([N, C, *spatial]) constrained to keep every spatial dim shorter than 2 x kernel x devices unsplit
    on the current trace mesh; unchanged without a mesh or such a dimension."""
    mesh = _trace_mesh.get()
    if mesh is None or mesh.size == 1 or array.ndim != 2 + len(kernel):
        return array
    free = PartitionSpec.UNCONSTRAINED
    spatial = [None if k > 1 and n < 2 * k * mesh.size else free for n, k in zip(array.shape[2:], kernel)]
    if None not in spatial:
        return array
    return jax.lax.with_sharding_constraint(array, NamedSharding(mesh, PartitionSpec(free, free, *spatial)))


def _patch_convolution_inputs():
    def make(stock):
        @functools.wraps(stock)
        def convolution(input, weight, *args, **kwargs):
            return stock(whole_small_spatial_dims(input, weight.shape[2:]), weight, *args, **kwargs)

        return convolution

    label = "convolutions keep small spatial dims whole"
    if patching.wrap(jaten, "_aten_convolution", make, label):
        patching.wrap(
            ops_registry.all_aten_ops[torch.ops.aten.convolution],
            "func",
            lambda registered: jaten._aten_convolution,
            label,
        )


# --- 17. An eager op on tensors of two meshes ----------------------------------------------------------------
# Reason: a VAE's buffers live on the VAE mesh (batch x spatial), the denoiser's outputs on the pipeline mesh
# (dp x sp x tp): the same devices, two meshes. An eager op mixing both (LTX-2 DFR normalizes latents with the VAE's
# statistics, then subtracts a transformer output) lets XLA pick an output sharding that JAX cannot name on the
# first operand's mesh, and JAX raises ``IndivisibleError`` before anything is computed. Such an op is run again
# with the operands off the current trace mesh replicated onto it (in place: same tensor objects, same values).
# Guard: wraps ``Environment.dispatch`` (0.0.10 - 0.0.13) once; costs nothing unless that error is raised.
def _onto_trace_mesh(tensors) -> bool:
    """Replicate each torchax tensor whose array lies on another mesh onto the trace mesh; whether any moved."""
    mesh, moved = _trace_mesh.get(), False
    for tensor in tensors:
        sharding = getattr(torchax_private.array(tensor), "sharding", None)
        if mesh is not None and isinstance(sharding, NamedSharding) and sharding.mesh != mesh:
            torchax_private.set_array(
                tensor, jax.device_put(torchax_private.array(tensor), NamedSharding(mesh, PartitionSpec()))
            )
            moved = True
    return moved


def _mixed_mesh_operands(stock):
    def dispatch(self, func, types, args, kwargs):
        try:
            return stock(self, func, types, args, kwargs)
        except jax_private.indivisible_error():
            operands = [x for x in pytree.tree_leaves((args, kwargs)) if isinstance(x, Tensor)]
            if not _onto_trace_mesh(operands):
                raise
            return stock(self, func, types, args, kwargs)

    return dispatch


# --- 18. aten ops torchax does not lower: window factories, in-place cumulative sums ------------------------------
# Reason: torchax has no lowering of aten's window factories (hann, hamming, blackman, bartlett, kaiser) nor of
# ``cumsum_`` / ``cumprod_``; Kandinsky 6 SR (a Hann window blending its tiles, NABLA's ``vals.cumsum_(-1)``)
# stopped with OperatorNotFound. Windows take no tensors: torch computes them on the host and they enter JAX as
# constants (stock's values). The in-place sums are torchax's functional ones written back (its ``InplaceOp``).
# Guard: registered only for overloads torchax does not lower itself (0.0.10 - 0.0.13 lower none of them).
_WINDOWS = ("hann_window", "hamming_window", "blackman_window", "bartlett_window", "kaiser_window")


def _host_window(overload):
    def window(*args, dtype=None, layout=None, device=None, pin_memory=None, requires_grad=False):
        if dtype is not None and not isinstance(dtype, torch.dtype):
            dtype = mappings.j2t_dtype(dtype)
        return jnp.asarray(overload(*args, dtype=dtype).numpy())

    return window


def _patch_missing_ops():
    env = torchax.default_env()  # built already: its op table is a copy of the registry

    def register(overload, implementation, **kind):
        if overload not in ops_registry.all_aten_ops:
            ops_registry.register_torch_dispatch_op(overload, implementation, **kind)
            torchax_private.op_table(env)[overload] = ops_registry.all_aten_ops[overload]

    for name in _WINDOWS:
        packet = getattr(torch.ops.aten, name)
        for overload_name in packet.overloads():
            if not overload_name.endswith("out"):
                register(getattr(packet, overload_name), _host_window(getattr(packet, overload_name)))
    for inplace, functional in (
        (torch.ops.aten.cumsum_, torch.ops.aten.cumsum),
        (torch.ops.aten.cumprod_, torch.ops.aten.cumprod),
    ):
        register(inplace.default, op_base.InplaceOp(functional), is_jax_function=False, is_view_op=True)
    patching.record("window functions and in-place cumulative sums")


# --- 19. Group norm run eagerly ----------------------------------------------------------------------------------
# Reason: torchax 0.0.10-0.0.13 computes ``aten.native_group_norm`` with ``jax.lax.map`` over a function it defines
# anew on every call; outside a trace JAX wraps that map in a program keyed by the function, so every eager group
# norm compiled again (a UNet run eagerly while a pipeline's forward hooks are registered, as SAG's: 124 programs
# per call). Outside a trace it now runs as one program per shape, group count and epsilon; inside, unchanged.
# Guard: wraps the registered implementation once.
def _patch_eager_group_norm():
    def make(stock):
        jitted = jax.jit(stock, static_argnums=(3, 4, 5, 6, 7))

        @functools.wraps(stock)
        def group_norm(input, weight, bias, N, C, HxW, group, eps=1e-5):
            traced = any(isinstance(x, jax.core.Tracer) for x in (input, weight, bias))
            return (stock if traced else jitted)(input, weight, bias, N, C, HxW, group, eps)

        return group_norm

    label = "group norm compiled once per shape when run eagerly"
    if patching.wrap(jaten, "_aten_native_group_norm", make, label):
        patching.wrap(
            ops_registry.all_aten_ops[torch.ops.aten.native_group_norm],
            "func",
            lambda registered: jaten._aten_native_group_norm,
            label,
        )


# --- 20. Math on a JAX tensor outside the environment names the fix ---------------------------------------------
# Reason: outside a pipeline call (user code holding a moved module's weight, say) torchax refuses any op on its
# tensors with "wrap your code with torchax.default_env()", advice about torchax's internals that is wrong for a
# diffusers user, and even ``.cpu()`` was refused. A copy to the host now works (a transfer, as torch's ``.cpu()``),
# a copy to the 'jax' device in the same dtype is the same buffer (``module.to(module.device)`` is idempotent:
# diffusers' ``load_ip_adapter`` does it on a moved UNet); any other op is refused with an error that says what the
# tensor is and the two ways that work. Guard: torchax 0.0.13's class-level ``Tensor.__torch_dispatch__`` and its
# message.
class JaxTensorOutsideCall(RuntimeError):
    """An op on a tensor that lives on JAX, outside a pipeline call."""


def _patch_outside_math():
    def make(stock):
        def dispatch(cls, func, types, args=(), kwargs=None):
            try:
                return stock.__func__(cls, func, types, args, kwargs)
            except AssertionError as error:
                if "can only do math within the torchax environment" not in str(error):
                    raise
                held = next((a for a in pytree.tree_leaves((args, kwargs)) if isinstance(a, Tensor)), None)
                copy = func is torch.ops.aten._to_copy.default and held is args[0]
                target = torch.device((kwargs or {}).get("device") or "jax").type if copy else None
                if target == "cpu":  # .cpu(), .to("cpu")
                    with warnings.catch_warnings():  # a read-only view of JAX's buffer: cloned at once
                        warnings.simplefilter("ignore", UserWarning)
                        host = mappings.j2t(held.jax()).clone()
                    return host.to((kwargs or {}).get("dtype") or host.dtype)
                if target == "jax" and (kwargs or {}).get("dtype") in (None, held.dtype):  # already there
                    return Tensor(
                        held.jax(), torchax_private.environment_of(held)
                    )  # a new wrapper of the same (immutable) buffer
                what = f"a {tuple(held.shape)} {held.dtype} tensor" if held is not None else "a tensor"
                raise JaxTensorOutsideCall(
                    f"{func} on {what} that lives on JAX (a weight of a pipeline moved with pipe.to('tpu'), or one "
                    "created on the 'jax' device), outside a pipeline call: torch cannot compute on it there. Take "
                    "a host copy with .cpu() and compute on that, or move the pipeline back with pipe.to('cpu')."
                ) from None

        return classmethod(dispatch)

    patching.wrap(Tensor, "__torch_dispatch__", make, "torchax math outside the environment names the fix")


# --- 21. A zero-dim tensor does not widen a dimensioned operand -------------------------------------------------
# Reason: torch promotes across dimensioned operands only: a bfloat16 latent times a 0-dim float32 tensor (DDIM's
# ``alphas_cumprod[t] ** 0.5``) stays bfloat16. JAX promotes the two arrays to float32, so a bfloat16 pipeline whose
# scheduler does not cast back (DDIM, PNDM; flow matching does) fed float32 latents to its next step: Latte in
# bfloat16 failed ("Input type (float) and bias type (BFloat16)"), others silently left stock's dtype. The result of
# those elementwise ops is cast to the dtype torch gives (``torch.result_type`` of the operands' dtypes and ranks).
# Guard: wraps ``Environment.dispatch`` (0.0.10 - 0.0.13) once; acts only when a 0-dim and a dimensioned tensor meet.
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


def _zero_dim_promotion(stock):
    def dispatch(self, func, types, args, kwargs):
        out = stock(self, func, types, args, kwargs)
        if func in _TWO_OPERANDS or func is torch.ops.aten.where.self:
            operands = args[:2] if func in _TWO_OPERANDS else args[1:3]
            expected = _torch_result_dtype(operands)
            true_division = func is torch.ops.aten.div.Tensor or (
                func is torch.ops.aten.div.Tensor_mode and (kwargs or {}).get("rounding_mode") is None
            )
            if expected is not None and true_division and not (expected.is_floating_point or expected.is_complex):
                expected = torch.get_default_dtype()  # torch divides integers into floats
            if expected is not None and isinstance(out, Tensor) and out.dtype != expected:
                out = stock(self, torch.ops.aten._to_copy.default, types, (out,), {"dtype": expected})
        return out

    return dispatch


# --- 22. FFTs on a simulated CPU mesh take their input whole ---------------------------------------------------
# Reason: XLA:CPU cannot run an FFT its SPMD partitioner splits (jaxlib 0.10.2: ``RET_CHECK failure ...
# fft_thunk.cc:168 LayoutUtil::IsMonotonicWithDim0Major``, for any split but the leading batch dim; plain
# ``jax.jit``), so FreeU's Fourier filter (``enable_freeu``) failed on the 8-device CPU mesh. On CPU meshes only
# (the TPU compiler compiles the same split FFTs, measured for v5e-8) an FFT's input and output are kept whole.
# Guard: wraps torchax's ``aten._fft_c2c`` / ``_fft_r2c`` / ``_fft_c2r`` lowerings (0.0.10 - 0.0.13) once.
_FFTS = {"_aten__fft_c2c": "_fft_c2c", "_aten__fft_r2c": "_fft_r2c", "_aten__fft_c2r": "_fft_c2r"}


def _whole_on_cpu_mesh(array):
    mesh = _trace_mesh.get()
    if mesh is None or mesh.size == 1 or mesh.devices.flat[0].platform != "cpu":
        return array
    return jax.lax.with_sharding_constraint(array, NamedSharding(mesh, PartitionSpec()))


def _patch_ffts():
    def make(stock):
        @functools.wraps(stock)
        def fft(input, *args, **kwargs):
            return _whole_on_cpu_mesh(stock(_whole_on_cpu_mesh(input), *args, **kwargs))

        return fft

    label = "FFTs take their input whole on CPU meshes"
    for lowering, op in _FFTS.items():
        if patching.wrap(jaten, lowering, make, label):
            registered = ops_registry.all_aten_ops[getattr(torch.ops.aten, op)]
            patching.wrap(registered, "func", lambda stock, lowering=lowering: getattr(jaten, lowering), label)


# --- 23. torchax's environment seeds its random key on the host ----------------------------------------------------
# Reason: building torchax's environment seeds ``jax.random.key(torch.initial_seed())``: two XLA programs (``stage``,
# ``threefry_seed``) in every process, for a key the package never draws from outside a trace (draws run on the host:
# patch 15). A threefry key's data is the seed's two 32-bit words (the high one 0 without x64): made on the host, it
# enters JAX as a transfer. Guard: only while the environment is built, only for JAX's default threefry keys (another
# ``jax_default_prng_impl`` keeps JAX's own seeding); the key data is compared with JAX's in the tests.
def host_seeded_key(seed: int) -> jax.Array:
    """``jax.random.key(seed)`` (threefry) without a program."""
    low = seed & 0xFFFFFFFF
    high = (seed >> 32) & 0xFFFFFFFF if jax.config.jax_enable_x64 else 0
    return jax.random.wrap_key_data(np.array([high, low], np.uint32), impl="threefry2x32")


@contextlib.contextmanager
def _keys_seeded_on_host():
    stock = jax.random.key
    if jax.config.jax_default_prng_impl != "threefry2x32":
        yield
        return

    def key(seed, *, impl=None):
        return host_seeded_key(int(seed)) if impl is None and isinstance(seed, int) else stock(seed, impl=impl)

    jax.random.key = key
    try:
        yield
    finally:
        jax.random.key = stock


def apply() -> None:
    """Apply the torchax patches (idempotent); ``route_sdpa`` is applied by ``patches.apply``."""
    with _keys_seeded_on_host():
        torchax.default_env()  # built once, before a patch reads its op table (patch 23: its key made on the host)
    _patch_type_as()
    _patch_setitem()
    _patch_deepcopy()
    _patch_mixed_host_tensors()
    _patch_view_getitem()
    _patch_host_transfers()
    _patch_glue_views()
    _patch_strided_set()
    _patch_fill_diagonal()
    _patch_convolution_inputs()
    _patch_ffts()
    _patch_eager_group_norm()
    _patch_missing_ops()
    _patch_outside_math()
    _patch_dispatch()


# torchax's ``Environment.dispatch`` (every eager op and every traced one) wrapped by these layers, innermost first:
# each sees what the layers after it pass down. The mesh retry is outermost (it reruns whatever the others do); the
# host-scalar glue and the random draws never both answer a call (torch tags draws ``nondeterministic_seeded``).
DISPATCH_LAYERS = (
    ("zero-dim operands promote as in torch", _zero_dim_promotion),  # 21
    ("torchax in-place ops on views", _inplace_on_views),  # 9
    ("schedule glue on the host", _glue_on_host),  # 11
    ("random draws from torch's generators", _random_draws),  # 15
    ("eager ops on two meshes", _mixed_mesh_operands),  # 17
)


def _patch_dispatch():
    for label, layer in DISPATCH_LAYERS:
        patching.wrap(Environment, "dispatch", layer, label)
