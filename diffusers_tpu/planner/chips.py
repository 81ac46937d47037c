"""The targets ``diffusers-tpu plan`` and ``cost`` know by name (``--chips``): devices per slice or node, memory per
device and dense bf16 peak, for the verdict (fits?) and the floor step time; for TPU slices, the libtpu topology the
TPU compiler compiles for (``tpu_compiler``)."""

from __future__ import annotations

import dataclasses
import os

GIB = 1 << 30


@dataclasses.dataclass(frozen=True)
class Chip:
    devices: int  # JAX devices in the slice (or GPUs in the node)
    hbm_gib: float  # per device
    peak_tflops: float  # dense bf16, per device
    gpu: bool = False
    # libtpu's name for the slice ("v6e:2x4"): what ``tpu_compiler.devices`` compiles for; None: not known to libtpu
    topology: str | None = None
    hbm_gbps: float = 0.0  # HBM bandwidth per device, GB/s (vendor figure): only for roofline estimates
    ici_gbps: float = 0.0  # inter-chip bandwidth per device, GB/s, all links together (vendor figure): estimates only

    @property
    def generation(self) -> str | None:
        """The TPU generation as libtpu names it ("v5e", "v6e", "v5p", "v4"); None for GPUs."""
        return self.topology.split(":")[0] if self.topology else None

    def usable_gib(self) -> float:
        """Memory JAX can allocate per device: a TPU's HBM; on a GPU, JAX's pool, ``XLA_PYTHON_CLIENT_MEM_FRACTION``
        of the memory (JAX's default 0.75), read from the environment ``plan`` runs in (set it as the run will)."""
        if not self.gpu:
            return self.hbm_gib
        return round(self.hbm_gib * gpu_memory_fraction(), 2)


def gpu_memory_fraction() -> float:
    value = os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION", "").strip()
    try:
        fraction = float(value) if value else 0.75
    except ValueError:
        fraction = None
    if fraction is None or not 0 < fraction <= 1:
        raise ValueError(f"XLA_PYTHON_CLIENT_MEM_FRACTION={value!r} must be a fraction in (0, 1], e.g. 0.9.")
    return fraction


# Vendor figures as published (Cloud TPU docs; NVIDIA data sheets, SXM parts, dense bf16 without sparsity; memory
# as the driver reports it: 81,559 MiB and 143,771 MiB). v5p and v4 slices are named by TensorCores (2 per chip, one
# megacore device each); v7x-8 is taken as 4 chips of 2 TensorCores each seen as its own device: verify on hardware
# (libtpu 0.0.42 does not know v7x: it is planned by the CPU estimate only).
# ICI per chip as Cloud TPU publishes it in Gbps (v5e 1,600; v6e 3,584; v5p 4,800; v4 2,400), here in GB/s; a
# v5p/v4 chip is one megacore device.
_V5E, _V6E, _V5P, _V4 = (
    dict(hbm_gib=16, peak_tflops=197, hbm_gbps=819, ici_gbps=200),
    dict(hbm_gib=32, peak_tflops=918, hbm_gbps=1640, ici_gbps=448),
    dict(hbm_gib=95, peak_tflops=459, hbm_gbps=2765, ici_gbps=600),
    dict(hbm_gib=32, peak_tflops=275, hbm_gbps=1228, ici_gbps=300),
)
CHIPS = {
    "v5e-1": Chip(1, **_V5E, topology="v5e:1x1"),
    "v5e-4": Chip(4, **_V5E, topology="v5e:2x2"),
    "v5e-8": Chip(8, **_V5E, topology="v5e:2x4"),
    "v5e-16": Chip(16, **_V5E, topology="v5e:4x4"),
    "v6e-1": Chip(1, **_V6E, topology="v6e:1x1"),
    "v6e-4": Chip(4, **_V6E, topology="v6e:2x2"),
    "v6e-8": Chip(8, **_V6E, topology="v6e:2x4"),
    "v6e-16": Chip(16, **_V6E, topology="v6e:4x4"),
    "v5p-8": Chip(4, **_V5P, topology="v5p:2x2x1"),
    "v5p-16": Chip(8, **_V5P, topology="v5p:2x2x2"),
    "v4-8": Chip(4, **_V4, topology="v4:2x2x1"),
    "v4-32": Chip(16, **_V4, topology="v4:2x2x4"),
    "v7x-8": Chip(8, 96, 2307 / 2),
    "h100-80gb": Chip(1, 79.65, 989.4, gpu=True, hbm_gbps=3350),
    "h100-80gb-x8": Chip(8, 79.65, 989.4, gpu=True, hbm_gbps=3350),
    "h200-141gb": Chip(1, 140.4, 989.4, gpu=True, hbm_gbps=4800),
    "h200-141gb-x8": Chip(8, 140.4, 989.4, gpu=True, hbm_gbps=4800),
}


def candidate_meshes(devices: int, heads: int | None) -> list[dict]:
    """Every (dp, sp, tp) over ``devices``: dp at most 2 (the guidance pair), tp dividing the head count."""
    meshes = []
    for dp in (2, 1):
        for tp in range(devices, 0, -1):
            if devices % (dp * tp) or (heads and heads % tp):
                continue
            meshes.append({"dp": dp, "sp": devices // (dp * tp), "tp": tp})
    return meshes
