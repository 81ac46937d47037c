"""torchax's ops on a device mesh, a section each: convolutions never split a small spatial dimension,
an eager op on tensors of two meshes, FFTs on a simulated CPU mesh. Each patch with its reason and guard;
``torchax_tensors.apply`` applies them in order."""

from __future__ import annotations

import contextlib
import contextvars
import functools

import jax
import torch
from jax.sharding import NamedSharding, PartitionSpec

from .. import torchax_private
from . import torchax_ops

# --- Convolutions never split a small spatial dimension over the mesh ---------------------------------------
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


def patch_convolution_inputs():
    def make(stock):
        @functools.wraps(stock)
        def convolution(input, weight, *args, **kwargs):
            return stock(whole_small_spatial_dims(input, weight.shape[2:]), weight, *args, **kwargs)

        return convolution

    label = "convolutions keep small spatial dims whole"
    torchax_ops.wrap_lowering("_aten_convolution", torch.ops.aten.convolution, make, label)


# --- An eager op on tensors of two meshes ----------------------------------------------------------------
# Reason: a VAE's buffers live on the VAE mesh (batch x spatial), the denoiser's outputs on the pipeline mesh
# (dp x sp x tp): the same devices, two meshes. An eager op mixing both (LTX-2 DFR normalizes latents with the VAE's
# statistics, then subtracts a transformer output) lets XLA pick an output sharding that JAX cannot name on the
# first operand's mesh, and JAX raises ``IndivisibleError`` before anything is computed. Such an op is run again
# with the operands off the current trace mesh replicated onto it (in place: same tensor objects, same values).
# Guard: a step of ``compat``'s one ``Environment.dispatch`` wrapper (0.0.10 - 0.0.13); costs nothing unless that error
# is raised.
def onto_trace_mesh(tensors) -> bool:
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


# --- FFTs on a simulated CPU mesh take their input whole ---------------------------------------------------
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


def patch_ffts():
    def make(stock):
        @functools.wraps(stock)
        def fft(input, *args, **kwargs):
            return _whole_on_cpu_mesh(stock(_whole_on_cpu_mesh(input), *args, **kwargs))

        return fft

    label = "FFTs take their input whole on CPU meshes"
    for lowering, op in _FFTS.items():
        torchax_ops.wrap_lowering(lowering, getattr(torch.ops.aten, op), make, label)
