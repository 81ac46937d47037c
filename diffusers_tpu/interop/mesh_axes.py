"""The device mesh's axis names and how a command line spells a mesh. Standard library only: the command line's
parser reads ``--mesh`` before torch or JAX is imported."""

from __future__ import annotations

import argparse

MESH_AXES = ("dp", "sp", "tp")  # default device layout order; measured fastest in the Wan 2.1 TPU guide


def mesh_arg(text: str) -> dict[str, int]:
    """``--mesh dp,sp,tp`` as every command line takes it (an argparse ``type``)."""
    try:
        sizes = [int(part) for part in text.split(",")]
    except ValueError:
        sizes = []
    if len(sizes) != 3 or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"--mesh takes three positive sizes dp,sp,tp (e.g. 2,1,4), got {text!r}")
    return dict(zip(MESH_AXES, sizes))
