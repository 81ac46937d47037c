"""A denoiser's repeated blocks' weights stored stacked on the devices: one ``[N, ...]`` array per weight of a block
list, so the compiled step loops over the layers by indexing it (``repeated_blocks``), as a scan over stacked
parameters does, with no per-layer copy into the loop — and without a second copy of the weights.

The module keeps its stock structure: every layer's parameter is a ``LayerView``, a torchax tensor whose value is
``stack.array[index]``, read (sliced) when something outside a compiled program uses it and written back into the
stack when an op assigns it in place. ``state_dict``, ``pipe.to("cpu")``, LoRA (merging runs on host copies that come
back as plain tensors: ``program_state`` writes them into the stack and puts the views back), unit mode under step
caches (each unit gets its layer's slice) and sharded loading (weights are placed per layer first, then stacked,
one weight name at a time) work unchanged. Which weights stack: those of a list ``block_signature.block_lists``
finds (interchangeable blocks), every layer's the same shape, dtype and sharding, not quantized, not tied, not held
for an exact restore, not a 16-bit float weight on CPU devices (``_cpu_bf16``). ``TPUConfig(scan_blocks=False)``
keeps per-layer storage.

``TPUConfig(fully_sharded_weights=True)``: each stack is stored sharded over the mesh axes its layers' own
sharding leaves unused too (``fully_sharded``), and the loop gathers a layer to its own sharding where it reads it:
weights per device divided by those axes' size, one all-gather of a layer's weights per use (FSDP's trade). The
module's other weights (embeddings, the head) are stored the same way and gathered where a program starts.
"""

from __future__ import annotations

import functools
import math

import jax
import torch
import torchax
from jax.sharding import NamedSharding, PartitionSpec
from torchax.ops import mappings
from torchax.tensor import Tensor

from ...interop import sharding
from ...interop.backend import host_to_jax, is_jax_tensor, wrap
from ...interop.host_stored import program_array
from ...interop.weights import Gathered, Stacked
from . import block_signature


class Stack:
    """The ``[N, ...]`` array holding one weight of N layers; ``layer_sharding``: a layer's, as it was placed (and as
    programs use it); ``gathered``: the array is stored sharded further (``fully_sharded``)."""

    def __init__(self, key: str, array: jax.Array, layer_sharding: NamedSharding, gathered: bool = False):
        self.key, self.array, self.layer_sharding, self.gathered = key, array, layer_sharding, gathered

    def layer(self, index: int) -> jax.Array:
        return _take(self.array, index, self.layer_sharding)

    def write(self, index: int, value: jax.Array) -> None:
        stored = self.array.sharding
        if stored.memory_kind == "pinned_host":  # updated on the devices (programs there cannot write host memory)
            on_devices = jax.device_put(self.array, stored.with_memory_kind("device"))
            updated = _putter(on_devices.sharding)(on_devices, value.astype(self.array.dtype), index)
            self.array = jax.device_put(updated, stored)
            return
        self.array = _putter(stored)(self.array, value.astype(self.array.dtype), index)


def _take(array, index: int, layer_sharding):
    return _taker(layer_sharding)(array, index)


@functools.lru_cache(maxsize=None)
def _taker(layer_sharding):
    """A layer out of a stack, with exactly the sharding it was placed with (``sharding_of`` reports it)."""
    return jax.jit(lambda array, index: array[index], static_argnums=1, out_shardings=layer_sharding)


@functools.lru_cache(maxsize=None)
def _putter(stored):
    """Layer ``index`` of a stack replaced in place (donated), the stack kept as it is stored."""
    return jax.jit(
        lambda array, value, index: array.at[index].set(value), static_argnums=2, donate_argnums=0, out_shardings=stored
    )


def fully_sharded(spec: PartitionSpec, shape: tuple, mesh) -> PartitionSpec:
    """``spec`` (a layer's sharding of ``shape``) extended over the mesh axes of size > 1 it does not use: onto its
    largest unsharded dimension they divide, else onto a sharded one whose size the combined axes divide; ``spec``
    itself where none does."""
    entries = list(spec) + [None] * (len(shape) - len(spec))
    used = {
        axis for entry in entries if entry is not None for axis in (entry if isinstance(entry, tuple) else (entry,))
    }
    free = tuple(axis for axis, size in mesh.shape.items() if size > 1 and axis not in used)
    if not free:
        return spec

    def axes(entry):
        return () if entry is None else entry if isinstance(entry, tuple) else (entry,)

    order = sorted(range(len(shape)), key=lambda d: (entries[d] is not None, -shape[d]))
    for dim in order:
        if shape[dim] % math.prod(mesh.shape[axis] for axis in axes(entries[dim]) + free) == 0:
            entries[dim] = (
                axes(entries[dim]) + free if entries[dim] is not None else (free if len(free) > 1 else free[0])
            )
            return PartitionSpec(*entries)
    return spec


def _layer_view_class():
    class LayerView(Tensor):
        """Layer ``index`` of a ``Stack``, as a torchax tensor (see the module docstring)."""

        def __new__(cls, stack: Stack, index: int, env):
            return Tensor.__new__(cls, jax.ShapeDtypeStruct(stack.array.shape[1:], stack.array.dtype), env)

        def __init__(self, stack: Stack, index: int, env):
            torch.Tensor.__init__(self)
            vars(self)["stack"], vars(self)["index"], vars(self)["_env"] = stack, index, env

        @property
        def _elem(self):
            return self.stack.layer(self.index)

        @_elem.setter
        def _elem(self, value):
            self.stack.write(self.index, value)

        @property
        def shape(self):
            return torch.Size(self.stack.array.shape[1:])

        @property
        def ndim(self):
            return self.stack.array.ndim - 1

        @property
        def dtype(self):  # read without slicing the layer out (a program per layer index)
            return mappings.j2t_dtype(self.stack.array.dtype)

    return LayerView


LayerView = None


def layer_view(stack: Stack, index: int) -> torch.Tensor:
    global LayerView
    if LayerView is None:
        LayerView = _layer_view_class()
    return LayerView(stack, index, torchax.default_env())


def is_view(tensor) -> bool:
    return LayerView is not None and isinstance(tensor, LayerView)


def _is_view_of(tensor, stack: Stack, index: int) -> bool:
    return is_view(tensor) and tensor.stack is stack and tensor.index == index


def install(slot, view) -> None:
    """Put ``view`` in the slot as it is: ``torch.nn.Parameter`` of a tensor subclass returns a detached copy of it
    (for a view, the slice), and a placed parameter is a torchax tensor marked as one, as ``Parameter`` makes it."""
    if slot.kind == "param":
        view._is_param = True
        slot.owner._parameters[slot.name] = view
    else:
        sharding.set_tensor(slot, view)


def _cpu_bf16(dtype, mesh) -> bool:
    """A 16-bit float stack on XLA:CPU, which computes those in float32 and converts the loop-carried stack
    itself (a float32 copy of every layer: twice the weights' bytes in temporaries, seen in ``plan``'s CPU
    estimates): such weights stay per layer on the CPU (the TPU and GPU compilers keep 16-bit stacks as they are)."""
    itemsize = torch.empty((), dtype=dtype).element_size() if isinstance(dtype, torch.dtype) else dtype.itemsize
    floating = dtype.is_floating_point if isinstance(dtype, torch.dtype) else jax.numpy.issubdtype(dtype, "floating")
    return itemsize == 2 and floating and mesh.devices.flat[0].platform == "cpu"


def groups(module: torch.nn.Module, slots: list, mesh=None) -> list[tuple[str, list]]:
    """``(key, [slot of layer 0, 1, ...])`` for every weight that stacks (see the module docstring); with ``mesh``,
    not the 16-bit float ones on CPU devices (``_cpu_bf16``)."""
    by_name = {slot.qualified: slot for slot in slots}
    counts: dict[int, int] = {}
    for slot in slots:
        counts[id(sharding.tensor_of(slot))] = counts.get(id(sharding.tensor_of(slot)), 0) + 1
    found = []
    for path, blocks in block_signature.block_lists(module):
        template = blocks[0]
        names = [n for n, _ in template.named_parameters(remove_duplicate=False)]
        names += [n for n, _ in template.named_buffers(remove_duplicate=False)]
        for name in names:
            members = [by_name.get(f"{path}.{i}.{name}") for i in range(len(blocks))]
            if any(
                m is None
                or m.scale is not None
                or m.compute is not None
                or m.keep_original is not None
                or m.host is not None
                or counts[id(sharding.tensor_of(m))] > 1
                for m in members
            ):
                continue
            first = members[0]
            if mesh is not None and _cpu_bf16(first.dtype, mesh):
                continue
            if any(
                m.dtype != first.dtype
                or tuple(m.spec or ()) != tuple(first.spec or ())
                or tuple(sharding.tensor_of(m).shape) != tuple(sharding.tensor_of(first).shape)
                for m in members
            ):
                continue
            found.append((f"{path}.#.{name}", members))
    return found


@functools.partial(jax.jit, static_argnums=0)
def _stacked(sharding_, *layers):
    return jax.lax.with_sharding_constraint(jax.numpy.stack(layers), sharding_)


def stack(module: torch.nn.Module, mesh, fully_shard: bool = False) -> int:
    """Store the placed module's stackable weights stacked (one weight name at a time: the per-layer arrays are
    freed as their stack is made), ``fully_shard``: over every mesh axis (``fully_sharded``); returns how many."""
    slots = sharding.slots_of(module)
    made = 0
    for key, members in groups(module, slots, mesh):
        tensors = [sharding.tensor_of(m) for m in members]
        if not all(is_jax_tensor(t) and not is_view(t) for t in tensors):
            continue
        spec = members[0].spec or PartitionSpec()
        stored = fully_sharded(spec, tuple(tensors[0].shape), mesh) if fully_shard else spec
        target = NamedSharding(mesh, PartitionSpec(None, *stored))
        stack_ = Stack(
            key, _stacked(target, *[t.jax() for t in tensors]), tensors[0].jax().sharding, gathered=stored != spec
        )
        install_stack(stack_, members)
        made += 1
    if fully_shard:
        _shard_the_rest(slots, mesh)
    return made


def stack_from_host(module: torch.nn.Module, slots: list, mesh, fully_shard: bool = False) -> int:
    """Before ``sharding.place``: each stackable weight whose layers are still host tensors is stacked on the host and
    copied to the devices already stacked (one weight name at a time), its layers installed as views; ``place`` then
    skips them. A transfer, no program (``stack`` compiles one per weight shape on the devices), and no second copy
    of a weight on the devices. Returns how many; the rest (meta tensors of sharded loading) stack after placing."""
    made = 0
    for key, members in groups(module, slots, mesh):
        tensors = [sharding.tensor_of(m) for m in members]
        if any(is_jax_tensor(t) or t.device.type != "cpu" for t in tensors):
            continue
        spec = members[0].spec or PartitionSpec()
        stored = fully_sharded(spec, tuple(tensors[0].shape), mesh) if fully_shard else spec
        dtype = members[0].dtype
        with torch.no_grad():
            host = torch.stack([t.detach().to(dtype) for t in tensors])
        array = host_to_jax(host, NamedSharding(mesh, PartitionSpec(None, *stored)))
        del host
        install_stack(Stack(key, array, NamedSharding(mesh, spec), gathered=stored != spec), members)
        made += 1
    return made


def install_stack(stack_: Stack, members: list) -> None:
    """Every member slot becomes a view of its layer of ``stack_``."""
    for index, member in enumerate(members):
        install(member, layer_view(stack_, index))
        member.stack = (stack_, index)


def _shard_the_rest(slots: list, mesh) -> None:
    """The unstacked weights stored over every mesh axis too (``slot.gather``: the sharding programs use)."""

    def stored(slot, tensor):
        if slot.stack is not None or slot.scale is not None or not is_jax_tensor(tensor) or is_view(tensor):
            return None
        spec = slot.spec or PartitionSpec()
        full = fully_sharded(spec, tuple(tensor.shape), mesh)
        return wrap(jax.device_put(tensor.jax(), NamedSharding(mesh, full))) if full != spec else None

    sharding.replace(slots, stored)
    for slot in slots:
        tensor = sharding.tensor_of(slot)
        if slot.stack is None and is_jax_tensor(tensor) and not is_view(tensor):
            spec = slot.spec or PartitionSpec()
            if tensor.jax().sharding.spec != NamedSharding(mesh, spec).spec:
                slot.gather = NamedSharding(mesh, spec)


def program_state(slots: list, value) -> dict:
    """What a compiled program receives for ``slots``: ``{qualified: value(slot, array)}`` for per-layer weights and
    one ``Stacked`` entry per stack whose layers are all still views of it. A layer whose tensor was replaced (LoRA
    merging brings plain tensors back) is written into its stack first and its view put back."""
    state, stacks = {}, {}
    for slot in slots:
        entry = getattr(slot, "stack", None)
        if entry is not None:
            stack_, index = entry
            tensor = sharding.tensor_of(slot)
            if not _is_view_of(tensor, stack_, index):
                if is_jax_tensor(tensor) and tuple(tensor.shape) == tuple(stack_.array.shape[1:]):
                    stack_.write(index, tensor.jax())
                    install(slot, layer_view(stack_, index))
                else:  # no longer this stack's layer (a different shape): per-layer from now on
                    slot.stack = None
                    state[slot.qualified] = value(slot, tensor.jax())
                    continue
            stacks.setdefault(id(stack_), (stack_, {}))[1][index] = slot.qualified
            continue
        array = value(slot, program_array(sharding.tensor_of(slot)))
        gather = getattr(slot, "gather", None)
        state[slot.qualified] = (
            Gathered(array, gather) if gather is not None and slot.scale is None and slot.compute is None else array
        )
    for stack_, names in stacks.values():
        if sorted(names) != list(range(stack_.array.shape[0])):  # a layer left the stack: slice what remains
            state.update({name: stack_.layer(i) for i, name in names.items()})
            continue
        state[stack_.key] = Stacked(
            stack_.array, tuple(names[i] for i in range(len(names))), stack_.layer_sharding if stack_.gathered else None
        )
    return state


def abstract(module: torch.nn.Module, slots: list, state: dict, mesh, fully_shard: bool = False) -> dict:
    """``plan``'s abstract weights (``{qualified: ShapeDtypeStruct}``, sharded) stacked as the runtime stacks them."""
    state = dict(state)
    for key, members in groups(module, slots, mesh):
        if not all(m.qualified in state and isinstance(state[m.qualified], jax.ShapeDtypeStruct) for m in members):
            continue
        first = state[members[0].qualified]
        spec = first.sharding.spec if first.sharding is not None else PartitionSpec()
        stored = fully_sharded(spec, tuple(first.shape), mesh) if fully_shard else spec
        array = jax.ShapeDtypeStruct(
            (len(members), *first.shape), first.dtype, sharding=NamedSharding(mesh, PartitionSpec(None, *stored))
        )
        for member in members:
            del state[member.qualified]
        state[key] = Stacked(
            array, tuple(m.qualified for m in members), NamedSharding(mesh, spec) if stored != spec else None
        )
    if fully_shard:  # the other weights as ``_shard_the_rest`` stores them
        for name, value in list(state.items()):
            if isinstance(value, jax.ShapeDtypeStruct) and value.sharding is not None:
                spec = value.sharding.spec
                stored = fully_sharded(spec, tuple(value.shape), mesh)
                if stored != spec:
                    state[name] = Gathered(
                        jax.ShapeDtypeStruct(value.shape, value.dtype, sharding=NamedSharding(mesh, stored)),
                        value.sharding,
                    )
    return state
