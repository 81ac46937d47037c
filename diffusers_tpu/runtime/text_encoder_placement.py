"""Where text encoders run under ``TPUConfig(text_encoder="auto")``, the default.

On the devices a text encoder is fast (UMT5-XXL, Wan's: 0.06 s on an H100 against 5.9 s on the host's CPU) but
its weights stay there for the whole call (11.4 GB in bfloat16), beside the denoiser's and the VAE's, while the
steps' activations and the VAE decode need the rest. ``pipe.to`` does not know the call's size yet, so the rule
is on the weights, which it knows exactly as they will be placed:

- CPU devices: on the host. They are the host's own cores; compiling the encoders would only add compile time.
- accelerators: on the devices when every component's weights, per device as placed (the denoiser sharded by its
  rules, encoders and VAE replicated), take at most ``WEIGHT_SHARE`` of the smallest device's memory limit; on the
  host otherwise, and on the host when a device reports no limit.

``diffusers-tpu plan`` applies the same rule to its target and gives the exact figure for a size; ``"host"``/``"jax"``
override.
"""

from __future__ import annotations

import math

import jax
import torch

from ..interop import processes, sharding

# The rest (60%) is for the steps' activations and the VAE decode. Wan2.1-1.3B with UMT5-XXL holds 15.6 GiB of
# weights: 26% of an H100's JAX pool (59.7 GiB; the last measured run with the encoder there peaked at 25.7 GiB);
# one v6e (32 GiB) would be 49%, where the plan puts the 480p decode near the limit: the rule says host.
WEIGHT_SHARE = 0.4


def text_encoder_names(pipe) -> list[str]:
    return [n for n, m in pipe.components.items() if n.startswith("text_encoder") and isinstance(m, torch.nn.Module)]


def per_device_bytes(slots: list, mesh_shape: dict, one_byte_names: frozenset = frozenset()) -> int:
    """Bytes one device holds of a placed module: each tensor once (tied ones share), divided by the devices its
    spec splits it over; ``one_byte_names``: weights stored as int8 or fp8 (``TPUConfig(quantize=...)``)."""
    total = 0
    for slot in slots:
        if slot.spec is None:  # a tensor tied to one counted already
            continue
        tensor = sharding.tensor_of(slot)
        itemsize = 1 if slot.qualified in one_byte_names else slot.dtype.itemsize
        split = math.prod(sharding.axis_size(entry, mesh_shape) for entry in slot.spec if entry is not None)
        total += tensor.numel() * itemsize // split
    return total


def device_memory_limit(devices) -> int | None:
    """The smallest memory limit among the devices (each process reads its own, the smallest is agreed on, so every
    process decides alike); None on CPU devices or when one reports none."""
    local = [d for d in devices if d.process_index == jax.process_index()]
    limit = None
    if local and not any(d.platform == "cpu" for d in local):
        limits = [(d.memory_stats() or {}).get("bytes_limit") for d in local]
        limit = min(limits) if all(limits) else None
    return processes.smallest_across_processes(limit)


def choose(weight_bytes: int, memory_limit: int | None) -> str:
    """``"jax"`` or ``"host"`` for text encoders, from every component's weight bytes per device."""
    if memory_limit is None:
        return "host"
    return "jax" if weight_bytes <= WEIGHT_SHARE * memory_limit else "host"
