"""Weight-only quantization of a placed denoiser: ``TPUConfig(quantize="int8")``.

Every linear weight of the denoiser (``torch.nn.Linear``; LoRA adapters and ``_keep_in_fp32_modules`` excepted) is
stored on the devices as int8 with one float32 scale per output channel (symmetric, ``scale = max|w| / 127``), sharded
like the weight it replaces (the scale like the weight's output dimension). Inside each compiled program the weight is
rebuilt as ``q * scale`` in the weight's compute dtype right before its matmul, so XLA fuses the dequantization into the
product; activations are untouched. ``"fp8"`` stores ``float8_e4m3fn`` the same way (``max|w| / 448``).

The host keeps the original tensors while the pipeline is on JAX, so ``pipe.to("cpu")`` restores them exactly;
weights that were never on the host (sharded loading) come back dequantized.
"""

from __future__ import annotations

import dataclasses
import functools
import logging

import jax
import jax.numpy as jnp
import torch
from jax.sharding import NamedSharding, PartitionSpec

from ...interop import sharding
from ...interop.backend import jax_dtype, jax_to_host, wrap
from ...interop.sharding import keep_in_fp32
from ...interop.weights import Cast, Rebuilt

logger = logging.getLogger(__name__)

FORMATS = ("int8", "fp8")
_STORAGE = {"int8": (jnp.int8, 127.0), "fp8": (getattr(jnp, "float8_e4m3fn", None), 448.0)}


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Quantized(Rebuilt):
    """A quantized weight as a program argument: ``values`` (int8/fp8, ``[out, in]``) and ``scale`` (``[out]``)."""

    values: jax.Array
    scale: jax.Array
    dtype: jnp.dtype = dataclasses.field(metadata=dict(static=True))

    def rebuild(self) -> jax.Array:
        return dequantize(self.values, self.scale, self.dtype)


def dequantize(values: jax.Array, scale: jax.Array, dtype) -> jax.Array:
    return values.astype(dtype) * scale.astype(dtype)[:, None]


def check_format(fmt: str | None) -> None:
    """Raise a clear error for a format this JAX cannot store (before anything moves)."""
    if fmt is None:
        return
    if fmt not in FORMATS:
        raise ValueError(f"TPUConfig(quantize={fmt!r}) must be None or one of {list(FORMATS)}.")
    if _STORAGE[fmt][0] is None:
        raise ValueError(
            f"TPUConfig(quantize={fmt!r}) needs jax.numpy.float8_e4m3fn, which jax {jax.__version__} "
            "lacks; use quantize='int8' or upgrade JAX."
        )


def targets(module: torch.nn.Module) -> set[str]:
    """Qualified names of the weights to quantize: linear layers' weights, except LoRA adapters' and those of the
    modules the model keeps in float32 (``_keep_in_fp32_modules``: the time embedding, for precision)."""
    keep = getattr(module, "_keep_in_fp32_modules", None) or ()
    names = set()
    for prefix, owner in module.named_modules():
        name = f"{prefix}.weight" if prefix else "weight"
        if (
            isinstance(owner, torch.nn.Linear)
            and "lora_" not in prefix
            and owner.weight is not None
            and owner.weight.ndim == 2
            and owner.weight.is_floating_point()
            and not keep_in_fp32(name, keep)
        ):
            names.add(name)
    return names


@functools.partial(jax.jit, static_argnames=("fmt",))
def _quantize(weight: jax.Array, fmt: str):
    storage, top = _STORAGE[fmt]
    w = weight.astype(jnp.float32)
    peak = jnp.max(jnp.abs(w), axis=1)
    scale = jnp.where(peak > 0, peak / top, 1.0)
    scaled = w / scale[:, None]
    values = jnp.clip(jnp.round(scaled), -top, top) if fmt == "int8" else jnp.clip(scaled, -top, top)
    return values.astype(storage), scale


def _scale_sharding(weight_sharding: NamedSharding) -> NamedSharding:
    """A per-output-channel scale is sharded like its weight's output dimension."""
    spec = weight_sharding.spec
    return NamedSharding(weight_sharding.mesh, PartitionSpec(spec[0] if len(spec) else None))


def quantize_array(weight: jax.Array, fmt: str) -> tuple[jax.Array, jax.Array]:
    """``(values, scale)`` of a ``[out, in]`` weight, sharded like it (the scale like its output dimension)."""
    if not isinstance(weight.sharding, NamedSharding):
        return _quantize(weight, fmt)
    shardings = (weight.sharding, _scale_sharding(weight.sharding))
    return jax.jit(_quantize.__wrapped__, static_argnames=("fmt",), out_shardings=shardings)(weight, fmt=fmt)


def abstract(weight: jax.ShapeDtypeStruct, fmt: str, dtype) -> Quantized:
    """The ``Quantized`` program argument a placed weight becomes, as shapes and shardings (``plan``)."""
    values = jax.ShapeDtypeStruct(weight.shape, _STORAGE[fmt][0], sharding=weight.sharding)
    scale = jax.ShapeDtypeStruct((weight.shape[0],), jnp.float32, sharding=_scale_sharding(weight.sharding))
    return Quantized(values, scale, jnp.dtype(dtype))


def quantize_placed(module: torch.nn.Module, slots: list, originals: dict, fmt: str) -> None:
    """Replace the placed target weights of ``module`` by their quantized values (``originals``: qualified name
    -> the host tensor before placement, kept for an exact restore)."""
    done: dict[int, object] = {}
    for slot in slots:
        if slot.qualified not in originals:
            continue
        tensor = sharding.tensor_of(slot)
        if id(tensor) not in done:  # a tied weight's places share one quantized Parameter (the tensor held)
            values, scale = quantize_array(tensor.jax(), fmt)
            done[id(tensor)] = (tensor, torch.nn.Parameter(wrap(values), requires_grad=False), scale)
        _, values, slot.scale = done[id(tensor)]
        slot.host = host_weight
        original = originals[slot.qualified]
        if original.device.type != "meta":  # what restore would have returned unquantized
            slot.keep_original = original if original.dtype == slot.restore_dtype else original.to(slot.restore_dtype)
        sharding.set_tensor(slot, values)


def host_weight(slot) -> torch.Tensor:
    """A quantized slot's weight on the host as stock would hold it (``pipe.to("cpu")``, ``state_dict()``): the
    kept original, or — for a weight that was never on the host (sharded loading) — its dequantized values."""
    if slot.keep_original is not None:
        return slot.keep_original
    logger.warning(
        "%s was loaded straight to the devices and quantized: it returns to the host dequantized", slot.qualified
    )
    return jax_to_host(
        dequantize(sharding.tensor_of(slot).jax(), slot.scale, jax_dtype(slot.dtype)), slot.restore_dtype
    )


def program_value(slot, array: jax.Array):
    """What a compiled program receives for a slot: the array, or the quantized or narrower-stored weight to
    rebuild."""
    if slot.compute is not None:  # layerwise casting (``runtime.layerwise_casting``)
        return Cast(array, jnp.dtype(jax_dtype(slot.compute)))
    if slot.scale is None:
        return array
    return Quantized(array, slot.scale, jnp.dtype(jax_dtype(slot.dtype)))


def is_quantized(tensor: torch.Tensor) -> bool:
    """A tensor holding quantized values (a placed weight under ``TPUConfig(quantize=...)``)."""
    return tensor.dtype in (torch.int8, getattr(torch, "float8_e4m3fn", torch.int8))
