"""Weight placement: sharding rules -> a validated plan -> module tensors replaced by sharded torchax tensors.

A rule is ``(regex, spec)``: the first rule whose regex matches a tensor's qualified name (``re.search``) gives its
PartitionSpec, written with mesh axis names (a tuple of axis names shards one dimension over several axes). Unmatched
tensors are replicated. Rules see peft's LoRA layers through their base layer's name (``to_q.base_layer.weight`` is
``to_q.weight``), and adapter tensors are sharded like the layer they adapt (the naming a layer above registers:
``register_adapter_naming``, done by ``runtime.lora``). Planning validates every shape against the mesh before a single
byte moves, so a bad mesh leaves the module untouched. ``resync`` brings a placed module up to date after it changed on
the host (adapters loaded or deleted after the move).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterable, Mapping, Sequence

import jax
import torch
from jax.sharding import NamedSharding, PartitionSpec

from .backend import host_to_jax, is_jax_tensor, jax_dtype, jax_to_host, wrap

Rule = tuple[str, tuple]
_SAVED = "_diffusers_tpu_placement"


@dataclasses.dataclass
class _Slot:
    owner: torch.nn.Module
    kind: str  # "param", "buffer" or "attr"
    name: str
    qualified: str
    spec: PartitionSpec
    dtype: torch.dtype  # dtype on the device
    restore_dtype: torch.dtype  # dtype back on the host: the original one, unless the user asked for a cast
    keep_original: torch.Tensor | None  # tensors JAX cannot hold exactly (float64), restored as they were
    scale: jax.Array | None = None  # quantized weights (``quantize``): per-output-channel scales; dtype = compute dtype
    host: Callable[[_Slot], torch.Tensor] | None = None  # the host tensor, when the device holds an encoding of it
    # (stack, layer index) when a layer above stores it stacked (``runtime.stacked_weights``)
    stack: tuple | None = None
    gather: NamedSharding | None = None  # stored otherwise (sharded further, host memory): the sharding programs use
    compute: torch.dtype | None = None  # stored as ``dtype``, computed in this (layerwise casting)
    requires_grad: bool = False  # a parameter's, given back by ``restore`` (a fine-tune after the round trip)


@dataclasses.dataclass(frozen=True)
class AdapterNaming:
    """How adapter tensors (peft's LoRA) are named, given by the layer that owns them (``runtime.lora``).

    ``rule_name(qualified)``: the name sharding rules see (a wrapper's segment removed); ``derived_spec(qualified,
    shape, base_spec_of)``: an adapter tensor's spec from its layer's weight spec, or None if it is no adapter."""

    rule_name: Callable[[str], str]
    derived_spec: Callable[[str, Sequence[int], Callable[[str], tuple]], tuple | None]


_namings: list[AdapterNaming] = []


def register_adapter_naming(naming: AdapterNaming) -> None:
    if naming not in _namings:
        _namings.append(naming)


def axis_size(entry, mesh_shape: Mapping[str, int]) -> int:
    """Devices a spec entry (an axis name, or a tuple of them) splits a dimension over."""
    names = entry if isinstance(entry, tuple) else (entry,)
    size = 1
    for name in names:
        size *= mesh_shape.get(name, 1)
    return size


def keep_in_fp32(qualified: str, patterns: Sequence[str]) -> bool:
    # Same matching as diffusers' loader: a pattern names a module component of the qualified name.
    parts = qualified.split(".")
    return any(pattern in parts for pattern in patterns)


def _fit(spec, shape, mesh_shape) -> PartitionSpec:
    """Drop axes that do not divide their dimension (derived specs degrade to replication, never fail)."""
    entries = [e if e is None or shape[i] % axis_size(e, mesh_shape) == 0 else None for i, e in enumerate(spec)]
    return PartitionSpec(*entries)


def spec_for(qualified: str, shape: Sequence[int], rules: Iterable[Rule], mesh_shape: Mapping[str, int]):
    rules = list(rules)
    for naming in _namings:
        derived = naming.derived_spec(qualified, shape, lambda name: _rule_spec(name, rules))
        if derived is not None:
            return _fit(derived, shape, mesh_shape)
    for naming in _namings:
        qualified = naming.rule_name(qualified)
    return _validated(qualified, shape, rules, mesh_shape)


def _rule_spec(name: str, rules) -> tuple:
    return next((spec for pattern, spec in rules if re.search(pattern, name)), ())


def _validated(qualified: str, shape, rules, mesh_shape):
    for pattern, spec in rules:
        if re.search(pattern, qualified):
            if len(spec) > len(shape):
                raise ValueError(f"Sharding rule {pattern!r} gives {len(spec)} dims to {qualified} of shape {shape}.")
            for dim, entry in enumerate(spec):
                size = axis_size(entry, mesh_shape) if entry is not None else 1
                if shape[dim] % size != 0:
                    raise ValueError(
                        f"{qualified} has shape {tuple(shape)}; its dim {dim} ({shape[dim]}) cannot be split over "
                        f"{entry}={size} devices. Choose mesh sizes that divide it."
                    )
            return PartitionSpec(*spec)
    return PartitionSpec()


def plan(
    module: torch.nn.Module,
    mesh_shape: Mapping[str, int],
    rules: Iterable[Rule] = (),
    dtype: torch.dtype | None = None,
    keep_fp32: Sequence[str] = (),
    placed_ok: bool = False,
) -> list[_Slot]:
    """Every tensor of ``module`` with its spec and device dtype; raises before anything moves. ``placed_ok``:
    tensors already on JAX keep their current sharding (``resync``)."""
    rules = list(rules)
    slots, seen = [], set()
    for prefix, owner in module.named_modules():
        entries = [("param", n, t) for n, t in owner._parameters.items()]
        entries += [("buffer", n, t) for n, t in owner._buffers.items()]
        entries += [
            ("attr", n, t)
            for n, t in vars(owner).items()
            if isinstance(t, torch.Tensor) and not n.startswith("_") and n not in owner._parameters
        ]
        for kind, name, tensor in entries:
            if tensor is None:
                continue
            qualified = f"{prefix}.{name}" if prefix else name
            if is_jax_tensor(tensor):
                if not placed_ok:
                    raise ValueError(f"{qualified} is already a JAX tensor; move the pipeline to 'cpu' first.")
                spec = tensor.jax().sharding.spec if id(tensor) not in seen else None
                seen.add(id(tensor))
                slots.append(_Slot(owner, kind, name, qualified, spec, tensor.dtype, tensor.dtype, None))
                continue
            device_dtype = tensor.dtype
            if dtype is not None and tensor.is_floating_point() and not keep_in_fp32(qualified, keep_fp32):
                device_dtype = dtype
            restore_dtype = device_dtype
            if device_dtype == torch.float64:
                device_dtype = torch.float32
            elif device_dtype == torch.int64:
                device_dtype = torch.int32
            spec = spec_for(qualified, tuple(tensor.shape), rules, mesh_shape) if id(tensor) not in seen else None
            seen.add(id(tensor))
            keep = tensor if restore_dtype == tensor.dtype and tensor.dtype in (torch.float64, torch.int64) else None
            slot = _Slot(owner, kind, name, qualified, spec, device_dtype, restore_dtype, keep)
            slot.requires_grad = kind == "param" and tensor.requires_grad
            slots.append(slot)
    return slots


CHECKPOINT_ATTR = "_diffusers_tpu_checkpoint"  # qualified name -> a source with ``place(shape, dtype, sharding)``


def place(module: torch.nn.Module, slots: list[_Slot], mesh, memory_kind: str | None = None) -> None:
    """Replace the planned tensors by torchax tensors sharded over ``mesh`` (shared tensors stay shared), stored in
    the devices' ``memory_kind`` (default: theirs; ``"pinned_host"``: ``runtime.host_memory``)."""
    checkpoint = getattr(module, CHECKPOINT_ATTR, {})  # sharded loading: meta tensors read from their files

    def placed(slot, tensor):
        if is_jax_tensor(tensor):
            return None  # already placed (resync)
        sharding = NamedSharding(mesh, slot.spec or PartitionSpec(), memory_kind=memory_kind)
        if tensor.device.type == "meta":
            if slot.qualified not in checkpoint:
                raise ValueError(f"{slot.qualified} has no values (a meta tensor) and no checkpoint to read.")
            return wrap(checkpoint[slot.qualified].place(tuple(tensor.shape), slot.dtype, sharding))
        return wrap(host_to_jax(tensor if tensor.dtype == slot.dtype else tensor.to(slot.dtype), sharding))

    replace(slots, placed)
    setattr(module, _SAVED, slots)


def slots_of(module: torch.nn.Module) -> list[_Slot]:
    return getattr(module, _SAVED, [])


def needs_resync(module: torch.nn.Module) -> bool:
    """True when a tensor of a placed module is on the host (e.g. an adapter loaded after the move)."""
    return any(not is_jax_tensor(t) for t in module.parameters()) or any(
        t is not None and not is_jax_tensor(t) for t in module.buffers()
    )


def resync(module: torch.nn.Module, mesh, rules: Iterable[Rule] = ()) -> None:
    """Re-plan a placed module after it changed on the host: placed tensors keep their sharding (and how they are
    restored), new host tensors are placed by the rules (adapters like the layer they adapt), tensors that left
    the module are forgotten."""
    previous = {id(tensor_of(slot)): slot for slot in slots_of(module)}
    slots = plan(module, dict(mesh.shape), rules, placed_ok=True)
    for slot in slots:
        old = previous.get(id(tensor_of(slot)))
        if old is not None:
            slot.restore_dtype, slot.keep_original = old.restore_dtype, old.keep_original
            slot.dtype, slot.scale, slot.host = old.dtype, old.scale, old.host  # a quantized weight stays quantized
            slot.stack, slot.gather, slot.requires_grad = old.stack, old.gather, old.requires_grad
    place(module, slots, mesh)


def restore(module: torch.nn.Module) -> None:
    """Bring every placed tensor back to a CPU torch tensor of its original dtype."""
    slots = getattr(module, _SAVED, None)
    if slots is None:
        return

    def host(slot, tensor):
        if slot.keep_original is not None:
            return slot.keep_original
        if slot.host is not None:
            return slot.host(slot)
        if not hasattr(tensor, "jax"):  # the module moved it back itself (Cosmos' guardrail: ``.to("cpu")``)
            return tensor.to("cpu", slot.restore_dtype)
        return jax_to_host(tensor.jax(), slot.restore_dtype)

    replace(slots, host)
    for slot in slots:
        if slot.requires_grad:
            tensor_of(slot).requires_grad_(True)
    delattr(module, _SAVED)


def is_placed(module: torch.nn.Module) -> bool:
    return hasattr(module, _SAVED)


def sharding_of(tensor: torch.Tensor):
    """The NamedSharding of a placed tensor (for users and tests)."""
    return tensor.jax().sharding


def cast(module: torch.nn.Module, dtype: torch.dtype) -> None:
    """Cast placed floating tensors in place on the device (keeps their sharding)."""
    slots = getattr(module, _SAVED, ())
    changes = {id(slot): tensor_of(slot).is_floating_point() and tensor_of(slot).dtype != dtype for slot in slots}
    replace(
        slots,
        lambda slot, tensor: (
            wrap(tensor.jax().astype(jax_dtype(dtype)))
            if slot.scale is None and slot.compute is None and changes[id(slot)]
            else None
        ),
    )
    for slot in slots:
        if slot.scale is not None:  # quantized: only the dtype it is rebuilt in changes
            slot.dtype = slot.restore_dtype = dtype
            if slot.keep_original is not None:
                slot.keep_original = slot.keep_original.to(dtype)
        elif changes[id(slot)]:
            slot.dtype = slot.restore_dtype = dtype
            slot.keep_original = None


def _tensors(module: torch.nn.Module):
    for owner in module.modules():
        for kind, table in (("param", owner._parameters), ("buffer", owner._buffers)):
            for name, tensor in table.items():
                if tensor is not None:
                    yield _Slot(owner, kind, name, name, None, tensor.dtype, tensor.dtype, None)


def to_host_copies(module: torch.nn.Module) -> dict:
    """Swap the module's JAX tensors for host copies (to run stock torch code on them); returns their shardings
    for ``back_to_devices``."""
    shardings = {}

    def host_copy(slot, tensor):
        if not is_jax_tensor(tensor):
            return None
        shardings[(id(slot.owner), slot.kind, slot.name)] = tensor.jax().sharding
        return jax_to_host(tensor.jax())

    replace(list(_tensors(module)), host_copy)  # a tied tensor's other places share the first one's copy
    return shardings


def back_to_devices(module: torch.nn.Module, shardings: dict) -> None:
    """Put host tensors back where ``to_host_copies`` found them; new tensors stay for ``resync``."""

    def placed(slot, tensor):
        sharding = shardings.get((id(slot.owner), slot.kind, slot.name))
        return wrap(host_to_jax(tensor, sharding)) if sharding is not None and not is_jax_tensor(tensor) else None

    replace(list(_tensors(module)), placed)


def replace(slots: list[_Slot], new_value) -> None:
    """Give each slot ``new_value(slot, tensor)`` (None: leave it). Slots that share a tensor (tied weights) get
    one new tensor — one ``Parameter`` object, as before — so ties survive placing, casting and restoring."""
    done = {}
    for slot in slots:
        tensor = tensor_of(slot)
        if id(tensor) not in done:
            value = new_value(slot, tensor)
            if value is not None and slot.kind == "param" and not isinstance(value, torch.nn.Parameter):
                value = torch.nn.Parameter(value, requires_grad=False)
            done[id(tensor)] = (tensor, value)  # the old tensor held: its id is not reused meanwhile
        value = done[id(tensor)][1]
        if value is not None:
            set_tensor(slot, value)


def tensor_of(slot: _Slot) -> torch.Tensor:
    if slot.kind == "param":
        return slot.owner._parameters[slot.name]
    if slot.kind == "buffer":
        return slot.owner._buffers[slot.name]
    return vars(slot.owner)[slot.name]


def set_tensor(slot: _Slot, tensor: torch.Tensor) -> None:
    if slot.kind == "param":
        slot.owner._parameters[slot.name] = (
            tensor if isinstance(tensor, torch.nn.Parameter) else torch.nn.Parameter(tensor, requires_grad=False)
        )
    elif slot.kind == "buffer":
        slot.owner._buffers[slot.name] = tensor
    else:
        vars(slot.owner)[slot.name] = tensor


def constrain(tensor: torch.Tensor, mesh, spec: Sequence) -> torch.Tensor:
    """``with_sharding_constraint`` on a torchax tensor, dropping axes that do not divide its dims."""
    if not is_jax_tensor(tensor) or tensor.ndim < len(spec):
        return tensor
    mesh_shape = dict(mesh.shape)
    entries = [e if e is None or tensor.shape[i] % axis_size(e, mesh_shape) == 0 else None for i, e in enumerate(spec)]
    sharding = NamedSharding(mesh, PartitionSpec(*entries))
    return wrap(jax.lax.with_sharding_constraint(tensor.jax(), sharding))


class ActivationConstraint:
    """A forward pre-hook constraining a submodule's first positional input. A class, not a closure: hooks of
    interchangeable blocks compare equal (``runtime.repeated_blocks`` scans such blocks)."""

    def __init__(self, mesh, spec: Sequence):
        self.mesh, self.spec = mesh, tuple(spec)

    def __call__(self, _module, args):
        if not args:
            return None
        return (constrain(args[0], self.mesh, self.spec), *args[1:])


def add_activation_constraints(module: torch.nn.Module, rules: Iterable[Rule], mesh) -> list:
    """Constrain the first positional input of submodules matching a rule (e.g. sequence-parallel blocks)."""
    handles = []
    for name, sub in module.named_modules():
        for pattern, spec in rules:
            if re.search(pattern, name):
                handles.append(sub.register_forward_pre_hook(ActivationConstraint(mesh, spec)))
                break
    return handles
