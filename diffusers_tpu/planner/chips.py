"""The targets ``diffusers-tpu plan`` knows by name (``--chips``): devices per slice or node, memory per device and
dense bf16 peak, for the verdict (fits?) and the floor step time."""

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
# megacore device each); v7x-8 is taken as 4 chips of 2 TensorCores each seen as its own device: verify on hardware.
CHIPS = {
    "v5e-1": Chip(1, 16, 197), "v5e-8": Chip(8, 16, 197), "v6e-1": Chip(1, 32, 918), "v6e-8": Chip(8, 32, 918),
    "v5p-8": Chip(4, 95, 459), "v7x-8": Chip(8, 96, 2307 / 2), "v4-32": Chip(16, 32, 275),
    "h100-80gb": Chip(1, 79.65, 989.4, gpu=True), "h100-80gb-x8": Chip(8, 79.65, 989.4, gpu=True),
    "h200-141gb": Chip(1, 140.4, 989.4, gpu=True), "h200-141gb-x8": Chip(8, 140.4, 989.4, gpu=True),
}
