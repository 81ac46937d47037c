"""Compile ahead: a service runs ``warm_up`` for the sizes it will serve before taking requests, so no request pays
compilation (and, with JAX's persistent cache on — ``TPUConfig.cache_dir`` — later processes load the programs
instead of compiling them)."""

from __future__ import annotations

import time

import torch

from ..interop import jit
from .pipeline_runtime import is_attached


def warm_up(pipe, sizes: list[dict], **call) -> dict:
    """One call of ``pipe`` per size (``{"height": ..., "width": ..., "num_frames": ...}``; an image pipeline
    without ``num_frames``) with ``call``'s other arguments, outputs discarded. Give what you will serve: the step
    count (a few small programs depend on the length of the timestep schedule), negative prompt, guidance and
    ``output_type``; prompts are padded to a fixed length, so any prompt will do. Returns what it compiled:
    ``{"programs": n, "seconds": s}``; a later request of a warmed size and step count compiles nothing."""
    if not is_attached(pipe):
        raise ValueError(
            "warm_up compiles the JAX programs of a placed pipeline: call pipe.to('tpu') (or 'jax') first."
        )
    if not sizes or not all(isinstance(size, dict) for size in sizes):
        raise ValueError("warm_up needs a list of sizes, e.g. [dict(height=480, width=832, num_frames=81)].")

    start = time.perf_counter()
    with jit.compile_log() as log:
        for size in sizes:
            arguments = {**call, **size}
            arguments.setdefault("generator", torch.Generator().manual_seed(0))
            pipe(**arguments)
    return {"programs": log.compilations, "seconds": round(time.perf_counter() - start, 2)}
