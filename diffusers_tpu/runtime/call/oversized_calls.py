"""Calls that clearly cannot fit the devices are refused before anything is allocated (stock tries, and fails
after allocating tens of GB of host latents).

The rule is deliberately conservative, so it never refuses a call that would have run: the decoded video alone
(``num_frames x height x width x 3`` values in the VAE's dtype, which the VAE must hold on the devices before
``postprocess`` turns them into frames) against the memory of every device together. ``diffusers-tpu plan`` gives
the real figure.
"""

from __future__ import annotations

import os

GB = 1e9


def device_memory(devices) -> int:
    """Bytes the devices can hold together: their reported limits, or (CPU devices, which share it) the host's RAM."""
    limits = [(d.memory_stats() or {}).get("bytes_limit") if d.platform != "cpu" else None for d in devices]
    if limits and all(limits):
        return int(sum(limits))
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def check_fits(pipe, arguments: dict, devices) -> None:
    """Raise ``ValueError`` naming the figures when the call's decoded output cannot fit the devices' memory."""
    height, width = arguments.get("height"), arguments.get("width")
    frames = arguments.get("num_frames") or 1
    if arguments.get("output_type") == "latent" or not all(
        isinstance(v, int) and v > 0 for v in (height, width, frames)
    ):
        return  # the pipeline's own defaults, or nothing decoded: nothing to judge from the call
    vae = getattr(pipe, "vae", None)
    itemsize = getattr(getattr(vae, "dtype", None), "itemsize", 4)
    needed = frames * height * width * 3 * itemsize
    available = device_memory(devices)
    if needed > available:
        what = f"{frames} frames of {height}x{width}" if frames > 1 else f"a {height}x{width} image"
        raise ValueError(
            f"{type(pipe).__name__}: {what} take {needed / GB:.1f} GB decoded ({itemsize} bytes a value), more "
            "than the "
            f"{available / GB:.1f} GB of memory on the {len(devices)} device(s). Use a smaller height, width or "
            "num_frames, or more chips (TPUConfig(mesh=...)); `diffusers-tpu plan` shows what fits where."
        )
