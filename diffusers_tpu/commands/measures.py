"""What a benchmark reports about where it ran: chip peaks, package versions, peak device memory.

Shared by ``bench`` and ``profile``; imports nothing from the commands beside it.
"""

from __future__ import annotations

import importlib.metadata as metadata

import torch

from ..runtime.attach import pipeline_runtime

# Dense bf16 peak TFLOP/s per chip (vendor figures). device_kind substrings, most specific first.
PEAK_TFLOPS = (
    (("v5 lite", "v5e"), 197.0),
    (("v5p",), 459.0),
    (("v6 lite", "v6e"), 918.0),
    (("7x", "v7"), 2307.0),
    (("v4",), 275.0),
    (("v5",), 459.0),
    (("h200",), 989.0),
    (("h100",), 989.0),
)


def peak_tflops(device_kind: str) -> float | None:
    kind = device_kind.lower()
    for names, peak in PEAK_TFLOPS:
        if any(name in kind for name in names):
            return peak
    return None


def versions() -> dict:
    names = ("jax", "jaxlib", "torch", "torchax", "diffusers", "transformers", "diffusers-tpu")
    found = {}
    for name in names:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def peak_memory(pipe, cuda: bool):
    if cuda:
        return int(torch.cuda.max_memory_allocated())
    attached = pipeline_runtime.runtime_of(pipe)
    if attached is None:
        return None
    stats = [d.memory_stats() or {} for d in attached.mesh.devices.flat]
    peaks = [s["peak_bytes_in_use"] for s in stats if "peak_bytes_in_use" in s]
    return max(peaks) if peaks else None
