"""``TPUConfig(weights_in_host_memory=True)``: a component's weights stored in the host's memory, read by the devices.

JAX arrays live in a memory kind of their devices: ``"device"`` (HBM) or ``"pinned_host"`` (the host's RAM, which
TPUs and GPUs reach by DMA). Here every weight of a placed component is stored in ``pinned_host`` with the sharding
``pipe.to`` decided, and each slot's ``gather`` names that sharding in device memory: a compiled program moves a
weight to the devices where it reads it (``interop.weights.gathered``) — a denoiser's repeated blocks one layer per
iteration of the layer loop (``runtime.repeated_blocks``), so device memory holds about one layer of them at a time,
the other weights when the program starts. Nothing is computed differently: the results are the same.

The blocks' weights are stacked on the host before they are stored (``stacked_weights.Stack``, ``[N, ...]`` per
weight name, one name at a time), so storing a model takes almost no device memory (each block's vectors — biases,
norm scales — stay there, stacked: ``_streams``): a denoiser larger than a chip's memory can be stored and run. What
it costs: every step moves every layer's weights from the host again.
"""

from __future__ import annotations

import math

import jax
import torch
from jax.sharding import NamedSharding, PartitionSpec

from ...interop import sharding
from ...interop.backend import host_to_jax, is_jax_tensor
from ...interop.host_stored import host_stored, is_host_stored
from ...interop.weights import Gathered, Stacked
from . import stacked_weights

MEMORY_KIND = "pinned_host"


def check_devices(devices) -> None:
    """Raise before anything moves when the devices have no host memory JAX can address."""
    kinds = {memory.kind for memory in devices[0].addressable_memories()}
    if MEMORY_KIND not in kinds:
        raise ValueError(
            f"TPUConfig(weights_in_host_memory=True) stores weights in JAX's {MEMORY_KIND!r} memory, which "
            f"{devices[0].platform} devices here do not offer ({sorted(kinds)}); drop weights_in_host_memory (or "
            "enable_sequential_cpu_offload) on this platform."
        )


def place(module: torch.nn.Module, slots: list, mesh, stack: bool) -> None:
    """Store ``module``'s planned tensors in host memory (``stack``: its repeated blocks' weights stacked first)."""
    if stack:
        _stack_on_host(module, slots, mesh)
    sharding.place(module, slots, mesh, memory_kind=MEMORY_KIND)
    views = {}  # one per tensor: tied weights stay tied
    for slot in slots:
        tensor = sharding.tensor_of(slot)
        if slot.stack is not None or stacked_weights.is_view(tensor) or is_host_stored(tensor):
            continue
        if id(tensor) not in views:
            used = NamedSharding(mesh, slot.spec or PartitionSpec(), memory_kind="device")
            views[id(tensor)] = (tensor, host_stored(tensor.jax(), used))
        view = views[id(tensor)][1]
        slot.gather = view.used
        stacked_weights.install(slot, view)


def _stack_on_host(module: torch.nn.Module, slots: list, mesh) -> None:
    for key, members in stacked_weights.groups(module, slots, mesh):
        tensors = [sharding.tensor_of(m) for m in members]
        if any(is_jax_tensor(t) or t.device.type == "meta" for t in tensors):
            continue  # placed already, or read from a checkpoint per layer (sharded loading): per layer
        spec = members[0].spec or PartitionSpec()
        dtype = members[0].dtype
        layers = torch.stack([t.detach().to(dtype) for t in tensors])
        in_host = _streams(tensors[0].ndim)
        kind = MEMORY_KIND if in_host else "device"
        stored = host_to_jax(layers, NamedSharding(mesh, PartitionSpec(None, *spec), memory_kind=kind))
        del layers
        used = NamedSharding(mesh, spec, memory_kind="device")
        stacked_weights.install_stack(stacked_weights.Stack(key, stored, used, gathered=in_host), members)


def _streams(layer_rank: int) -> bool:
    """Whether a stack of layers of this rank is stored in host memory. A vector per layer (biases, norm scales: a
    ``[L, D]`` stack, a few hundred KB) stays in device memory: the layer axis is then the second-minor one, and the
    TPU compiler cannot DMA one row of a 16-bit stack out of host memory ("sublane slicing size must be multiple of
    element packing factor", Wan2.1-14B bfloat16 on v5e, libtpu 0.0.42.1)."""
    return layer_rank >= 2


def abstract(state: dict) -> dict:
    """``plan``'s abstract weights (``{name: ShapeDtypeStruct | Stacked}``, sharded) as this stores them."""
    held = {}
    for name, value in state.items():
        if isinstance(value, Stacked) and value.layer_sharding is None and _streams(value.array.ndim - 1):
            stored = value.array
            layer = NamedSharding(stored.sharding.mesh, PartitionSpec(*stored.sharding.spec[1:]), memory_kind="device")
            held[name] = Stacked(_in_host(stored), value.names, layer)
        elif isinstance(value, jax.ShapeDtypeStruct) and value.sharding is not None:
            held[name] = Gathered(_in_host(value), value.sharding.with_memory_kind("device"))
        else:
            held[name] = value
    return held


def _in_host(value: jax.ShapeDtypeStruct) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(value.shape, value.dtype, sharding=value.sharding.with_memory_kind(MEMORY_KIND))


def bytes_per_device(held: dict) -> int:
    """Bytes one device's share of ``held`` (``abstract``'s or the runtime's state) keeps in host memory."""
    total = 0
    for value in held.values():
        array = value.array if isinstance(value, (Stacked, Gathered)) else value
        sharding = getattr(array, "sharding", None)
        if getattr(sharding, "memory_kind", None) == MEMORY_KIND:
            shard = sharding.shard_shape(array.shape)
            total += math.prod(shard) * array.dtype.itemsize
    return total
