"""LoRA (peft adapters) on JAX: the whole diffusers lifecycle on a moved pipeline.

- **Placement.** An adapter of a tensor-parallel layer is sharded consistently with it (``adapter_spec``): for a
  column-parallel layer (output features over tp) ``lora_A`` is replicated and ``lora_B`` split like the layer's
  output; for a row-parallel one (input features over tp) ``lora_A`` is split like the layer's input and ``lora_B``
  replicated. So ``x @ A.T @ B.T`` needs no more communication than the layer itself. Adapters loaded after the
  move stay on the host until the next call, which places them (``sharding.resync``).
- **Scales are program inputs.** peft keeps each adapter's scale as a Python float (``layer.scaling``), which a
  trace would bake into the program: ``set_adapters(weights=...)`` would be ignored. ``Scalings`` feeds them into
  the compiled program as one float32 vector instead (and folds ``attention_kwargs={"scale": s}`` in on the host,
  with diffusers' own ``scale_lora_layers``), so changing scales or adapter weights never recompiles; changing
  which adapters exist or are active (the ``key``) does.
- **Weight math.** ``fuse_lora``/``unfuse_lora`` run stock peft ``merge``/``unmerge`` on host copies of each
  layer's tensors, which return to the devices with their sharding (``on_host_copies``, installed by ``patches``).
"""

from __future__ import annotations

import contextlib
import functools
import re

import jax.numpy as jnp
import numpy as np
import torch
from diffusers.utils import scale_lora_layers, unscale_lora_layers

from ...interop import backend, sharding
from . import quantize

_LORA_TENSOR = re.compile(
    r"^(?P<base>.+)\.(?P<kind>lora_A|lora_B|lora_magnitude_vector)\.[^.]+(?:\.(?P<leaf>weight|bias))?$"
)
ATTENTION_KWARGS = ("attention_kwargs", "joint_attention_kwargs", "cross_attention_kwargs")


def is_lora_layer(module) -> bool:
    return hasattr(module, "scaling") and hasattr(module, "lora_A") and hasattr(module, "get_base_layer")


def lora_layers(root: torch.nn.Module) -> list:
    return [m for m in root.modules() if is_lora_layer(m)]


def base_on_jax(layer) -> bool:
    weight = getattr(layer.get_base_layer(), "weight", None)
    return weight is not None and backend.is_jax_tensor(weight)


# --- placement -------------------------------------------------------------------------------------------
def rule_name(qualified: str) -> str:
    """The name sharding rules see: peft's ``base_layer`` wrapper removed (``to_q.base_layer.weight`` ->
    ``to_q.weight``)."""
    return qualified.replace(".base_layer.", ".")


def adapter_spec(qualified: str, shape, base_spec_of) -> tuple | None:
    """The spec of a LoRA tensor from its layer's weight spec (``base_spec_of(name)``), or None if not LoRA."""
    match = _LORA_TENSOR.match(rule_name(qualified))
    if match is None:
        return None
    base = tuple(base_spec_of(f"{match['base']}.weight")) if len(shape) else ()
    out_axis = base[0] if len(base) >= 1 else None
    in_axis = base[1] if len(base) >= 2 else None
    if match["kind"] == "lora_A" and match["leaf"] == "weight" and len(shape) == 2:
        return (None, in_axis)
    if match["kind"] == "lora_B" and match["leaf"] == "weight" and len(shape) == 2:
        return (out_axis, None)
    if match["kind"] in ("lora_B", "lora_magnitude_vector") and len(shape) == 1:
        return (out_axis,)
    return ()  # conv / embedding adapters: replicated


sharding.register_adapter_naming(sharding.AdapterNaming(rule_name, adapter_spec))


# --- weight math on host copies -------------------------------------------------------------------------
def _around_host_copies(method, on_jax, refusal):
    """``method`` run on host copies of its object's tensors, put back on the devices with their sharding after;
    ``on_jax(self)`` False: the stock method; ``refusal(self)``: a reason to refuse (quantized weights), or None."""

    @functools.wraps(method)
    def run(self, *args, **kwargs):
        if not on_jax(self):
            return method(self, *args, **kwargs)
        reason = refusal(self)
        if reason:
            raise ValueError(reason)
        placed = sharding.to_host_copies(self)
        try:
            return method(self, *args, **kwargs)
        finally:
            sharding.back_to_devices(self, placed)

    return run


def on_host_copies(method):
    """Wrap a peft layer method that computes on the layer's weights (merge, unmerge): for a layer on JAX, run it
    on host copies of the layer's tensors and put them back on the devices with their sharding."""

    def refusal(layer):
        base = getattr(layer.get_base_layer(), "weight", None)
        if base is not None and quantize.is_quantized(base):
            return (
                f"{method.__name__} on a LoRA layer whose base weight is quantized on JAX "
                "(TPUConfig(quantize=...)) would merge into int8 values. Fuse the LoRA on the host before "
                "pipe.to(...), or keep it unfused (adapters run unmerged on top of quantized weights)."
            )
        return None

    return _around_host_copies(method, base_on_jax, refusal)


def module_on_host_copies(method):
    """Wrap a module method that computes on the module's own weights (diffusers' ``fuse_projections``): for a
    module with tensors on JAX, run it on host copies of them and put them back with their sharding; tensors it
    creates stay on the host until the next call's resync places them."""

    def tensors(module):
        return [*module.parameters(), *module.buffers()]

    def refusal(module):
        if any(quantize.is_quantized(t) for t in tensors(module)):
            return (
                f"{type(module).__name__}.{method.__name__} on weights quantized on JAX (TPUConfig(quantize=...)) "
                "would combine int8 values. Call it on the host before pipe.to(...)."
            )
        return None

    return _around_host_copies(method, lambda m: any(backend.is_jax_tensor(t) for t in tensors(m)), refusal)


def each_fused_on_host(stock):
    """Wrap a model's ``fuse_qkv_projections``: each attention module's ``fuse_projections`` (its class's own) runs
    through ``module_on_host_copies``."""

    @functools.wraps(stock)
    def fuse_qkv_projections(self):
        modules = [m for m in self.modules() if callable(getattr(m, "fuse_projections", None))]
        for m in modules:  # the instance's own attribute shadows its class's method during the stock loop
            m.fuse_projections = module_on_host_copies(type(m).fuse_projections).__get__(m)
        try:
            return stock(self)
        finally:
            for m in modules:
                del m.fuse_projections

    return fuse_qkv_projections


# --- scales as program inputs ---------------------------------------------------------------------------
def layer_key(layer) -> tuple:
    return (
        tuple(layer.active_adapters),
        bool(layer.disable_adapters),
        tuple(layer.merged_adapters),
        tuple(layer.scaling),
        tuple(layer.lora_variant) if hasattr(layer, "lora_variant") else (),
    )


def structure_key(root) -> tuple:
    """Which adapters exist and are active per layer: a change retraces the program (and re-places weights)."""
    return tuple((name, layer_key(m)) for name, m in root.named_modules() if is_lora_layer(m))


def prepare(root) -> None:
    """What peft would do inside the next forward but must happen on the host: a merged layer whose adapters were
    disabled unmerges (stock peft does it in ``forward``, which on JAX is traced)."""
    for layer in lora_layers(root):
        if layer.disable_adapters and layer.merged:
            layer.unmerge()


class Scalings:
    """The adapters' scales of every LoRA layer under ``root`` as one program input (see the module docstring)."""

    def __init__(self, root: torch.nn.Module):
        self.root = root

    def key(self) -> tuple:
        return structure_key(self.root)

    def values(self) -> list:
        layers = lora_layers(self.root)
        if not layers:
            return []
        flat = [float(layer.scaling[a]) for layer in layers for a in layer.scaling]
        return [jnp.asarray(np.asarray(flat, dtype=np.float32))]

    def donated(self) -> int:
        return 0  # the scales are read again by the next call

    @contextlib.contextmanager
    def bound(self, arrays: list):
        """Inside a trace: every layer's ``scaling`` reads the traced vector."""
        layers = lora_layers(self.root)
        if not layers or not arrays:
            yield
            return
        vector, index, saved = arrays[0], 0, []
        for layer in layers:
            saved.append((layer, layer.scaling))
            traced = {}
            for adapter in layer.scaling:
                traced[adapter] = backend.wrap(vector[index])
                index += 1
            layer.scaling = traced
        try:
            yield
        finally:
            for layer, original in saved:
                layer.scaling = original


@contextlib.contextmanager
def scale_from_kwargs(root, kwargs: dict):
    """``attention_kwargs={"scale": s}`` applied as stock ``apply_lora_scale`` does (``scale_lora_layers`` before,
    ``unscale_lora_layers`` after), on the host, and removed from the keywords the program sees (a float there
    would be a compile-time constant: one program per scale)."""
    name = next((n for n in ATTENTION_KWARGS if isinstance(kwargs.get(n), dict) and "scale" in kwargs[n]), None)
    if name is None:
        yield kwargs
        return
    options = dict(kwargs[name])
    scale = options.pop("scale")
    kwargs = dict(kwargs, **{name: options})
    scale_lora_layers(root, scale)
    try:
        yield kwargs
    finally:
        unscale_lora_layers(root, scale)
