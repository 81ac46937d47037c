"""Compatibility of torchax with torch's semantics and JAX: the patches of torchax's behaviour the backend needs,
each with its reason and version guard, each set through ``patching.wrap``, one section per patch headed by what it
does. This module holds the general ones and ``apply``, which applies every section in order; views and indexing are in
``torchax_views``, the mesh in ``torchax_mesh``, op results in ``torchax_ops``. The patches of torch itself are in
``torch_itself``; ``runtime/patches/`` holds the diffusers-level ones at the top. This room imports nothing of
the package but ``host_scalars``, ``patching`` and the doors (all at the bottom of the import graph).
"""

from __future__ import annotations

import contextlib
import inspect
import warnings

import jax
import numpy as np
import torch
import torch.nn.functional as F
import torchax
from torchax.ops import mappings
from torchax.tensor import Environment, Tensor
from torchax.view import View

from .. import (
    host_scalars,
    jax_private,
    patching,
    torch_private,
    torchax_private,
)
from ..torch_private import pytree
from . import torchax_mesh, torchax_ops, torchax_views

# --- SDPA on the torchax default environment -----------------------------------------------------------
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
    table = torchax_private.op_table(environment)
    ops = (F.scaled_dot_product_attention, torch.ops.aten.scaled_dot_product_attention)
    saved = {op: table.get(op) for op in ops}
    for op in ops:
        environment.override_op_definition(op, scaled_dot_product_attention)

    def undo():
        global _torchax_sdpa_op
        for op, entry in saved.items():
            if entry is None:
                table.pop(op, None)
            else:
                table[op] = entry
        _torchax_sdpa_op = None

    patching.record("torchax SDPA override", undo)


def torchax_sdpa(*args):
    """torchax's own SDPA (used outside JAX pipeline calls)."""
    return _torchax_sdpa_op.func(*args, env=torchax.default_env())


# --- torchax Tensor.type_as returns a new tensor -------------------------------------------------------
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


# --- torchax Tensor.__setitem__ casts the value to the tensor's dtype ------------------------------------
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


# --- copy.deepcopy of a torchax tensor -----------------------------------------------------------------
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

    patching.replace(Tensor, "__deepcopy__", __deepcopy__, "torchax Tensor.__deepcopy__")
    patching.replace(View, "__deepcopy__", __deepcopy__, "torchax Tensor.__deepcopy__")
    stock = torch.Tensor.__deepcopy__

    def host_deepcopy(self, memo):
        if self.device.type == "cpu" and not isinstance(self, (Tensor, View)):
            with torch_private.plain_torch():
                return stock(self, memo)
        return stock(self, memo)

    patching.replace(torch.Tensor, "__deepcopy__", host_deepcopy, "torchax Tensor.__deepcopy__")


# --- A host tensor mixed into a JAX op is moved, as torch moves a CPU index or scalar ------------------------
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


# --- Host tensors enter JAX without a program ------------------------------------------------------------
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


# --- Math on a JAX tensor outside the environment names the fix ---------------------------------------------
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
                target = torch.device((kwargs or {}).get("device") or held.device).type if copy else None
                if target == "cpu":  # .cpu(), .to("cpu")
                    with warnings.catch_warnings():  # a read-only view of JAX's buffer: cloned at once
                        warnings.simplefilter("ignore", UserWarning)
                        host = mappings.j2t(held.jax()).clone()
                    return host.to((kwargs or {}).get("dtype") or host.dtype)
                if target == held.device.type and (kwargs or {}).get("dtype") in (None, held.dtype):  # already there
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


# --- torchax's environment seeds its random key on the host ----------------------------------------------------
# Reason: building torchax's environment seeds ``jax.random.key(torch.initial_seed())``: two XLA programs (``stage``,
# ``threefry_seed``) in every process, for a key the package never draws from outside a trace (draws run on the host,
# ``torchax_ops``). A threefry key's data is the seed's two 32-bit words (the high one 0 without x64): made here, it
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


# --- A JAX tensor's data_ptr() tells tensors apart, as torch's does ------------------------------------------
# Reason: torchax's Tensor is a wrapper without storage, so ``data_ptr()`` is 0 for every tensor. Code that keys a
# cache by it then takes two tensors for one: diffusers' TextKVCache keys the text K/V it keeps by
# ``encoder_hidden_states.data_ptr()``, so the negative prompt's pass would reuse the positive prompt's K/V — a
# silently different image. The patched one is the address of the array's first buffer on this host (distinct while
# both live, as torch's storage addresses are); a traced value has none: its id.
# Guard: only where torchax's Tensor has no ``data_ptr`` of its own (0.0.10 - 0.0.13 inherit torch's, 0 for a
# tensor without storage); probing one would start JAX at import.
def _patch_data_ptr():
    if "data_ptr" in vars(Tensor) and not patching.labels(vars(Tensor)["data_ptr"]):
        return

    def data_ptr(self):
        array = torchax_private.array(self)
        try:
            return array.addressable_shards[0].data.unsafe_buffer_pointer()
        except (AttributeError, IndexError, RuntimeError):  # a tracer, no buffer here, a deleted array
            return id(array)

    patching.wrap(Tensor, "data_ptr", lambda stock: data_ptr, "torchax Tensor.data_ptr")


def apply() -> None:
    """Apply the torchax patches (idempotent); ``route_sdpa`` is applied by ``entry_points.apply``."""
    with _keys_seeded_on_host():
        torchax.default_env()  # built once, before a patch reads its op table (its key made on the host, above)
    _patch_type_as()
    _patch_setitem()
    _patch_deepcopy()
    _patch_mixed_host_tensors()
    torchax_views.patch_view_getitem()
    _patch_host_transfers()
    torchax_views.patch_glue_views()
    torchax_views.patch_strided_set()
    torchax_views.patch_fill_diagonal()
    torchax_mesh.patch_convolution_inputs()
    torchax_mesh.patch_ffts()
    torchax_ops.patch_eager_group_norm()
    torchax_ops.patch_missing_ops()
    _patch_outside_math()
    _patch_data_ptr()
    _patch_dispatch()


# torchax's ``Environment.dispatch`` (every eager op and every traced one) wrapped ONCE, its steps run from that one
# frame in this order (each step's reason and guard at its number): ops the host answers never reach torchax, then
# the op (on a view's copy when torchax would lose its write), its dtype as torch's, and the whole again once on
# JAX's IndivisibleError with the operands on one mesh. The random draws and the glue never both answer a call
# (torch tags draws ``nondeterministic_seeded``).
DISPATCH_STEPS = (
    "random draws from torch's generators",  # 15 (torchax_ops, host_scalars.draw)
    "schedule glue on the host",  # 11 (torchax_views, host_scalars.run)
    "torchax in-place ops on views",  # 9 (torchax_views.written_through_view)
    "zero-dim operands promote as in torch",  # 21 (torchax_ops.promote_zero_dim)
    "eager ops on two meshes",  # 17 (torchax_mesh.onto_trace_mesh)
)


def _dispatch(stock):
    def dispatch(self, func, types, args, kwargs):
        for again in (False, True):
            try:
                result = host_scalars.NOT_GLUE
                if func in host_scalars.RANDOM_DRAWS:
                    result = host_scalars.draw(self, func, args, kwargs or {})
                if result is host_scalars.NOT_GLUE:
                    result = host_scalars.run(self, func, args, kwargs or {})
                if result is not host_scalars.NOT_GLUE:
                    return result
                if torchax_views.written_through_view(self, func, args):
                    view, copy = args[0], args[0].torch()
                    stock(self, func, types, (copy, *args[1:]), kwargs)
                    view.update(copy)
                    return view
                out = stock(self, func, types, args, kwargs)
                return torchax_ops.promote_zero_dim(stock, self, func, types, args, kwargs, out)
            except jax_private.indivisible_error():
                operands = [x for x in pytree.tree_leaves((args, kwargs)) if isinstance(x, Tensor)]
                if again or not torchax_mesh.onto_trace_mesh(operands):
                    raise

    return dispatch


def _patch_dispatch():
    patching.wrap(Environment, "dispatch", _dispatch, "torchax dispatch: " + "; ".join(DISPATCH_STEPS))
    for step in DISPATCH_STEPS:  # each listed as applied (``entry_points.applied``); undone with the wrapper
        patching.record(step)
