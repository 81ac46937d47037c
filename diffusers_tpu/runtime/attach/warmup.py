"""Compile ahead: a service runs ``warm_up`` for the sizes it will serve before taking requests, so no request pays
compilation (and, with JAX's persistent cache on — ``TPUConfig.compile_cache_dir`` — later processes load the
programs instead of compiling them).

By default the model does not run (maxdiffusion's "zero-execution warm-up"): the call walks through the pipeline with
every compiled program built and answering zeros of its outputs, at the shardings a real call's outputs have
(``compile_only``), so what runs between programs (scheduler steps, guidance, postprocessing) compiles exactly as in a
real call. The warm-up builds the programs a first call builds and no others: its compile time is the one it saves.
``workers=N`` builds the programs N at a time instead (a many-core host, large programs): a first walk lowers them all
and builds them in a pool, a second walk compiles what runs between them at the real shardings — the operations
between programs then compile twice (once for the first walk's unsharded zeros).
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import torch

from ...interop import compile_accounting, compile_only
from .pipeline_runtime import is_attached


def warm_up(pipe, sizes: list[dict], execute: bool = False, workers: int | None = None, **call) -> dict:
    """Compile every program a call of ``pipe`` runs, for each size (``{"height": ..., "width": ...,
    "num_frames": ...}``; an image pipeline without ``num_frames``), with ``call``'s other arguments. Give what you
    will serve: the step count (a few small programs depend on the length of the timestep schedule), negative prompt,
    guidance and ``output_type``; prompts are padded to a fixed length, so any prompt will do.

    ``execute=False`` (default): the model never runs; zeros stand for its programs' outputs (module docstring); text
    encoders kept on the host still encode the prompt. ``execute=True``: one real call per size, outputs discarded.
    ``workers``: programs built at once (default 1: the walk's own order, nothing compiled twice; N > 1 builds
    concurrently and compiles what runs between programs twice, each big compile taking host memory).

    Returns ``{"programs": n, "seconds": s}``; a later request of a warmed size and step count compiles nothing."""
    if not is_attached(pipe):
        raise ValueError(
            "warm_up compiles the JAX programs of a placed pipeline: call pipe.to('tpu') (or 'jax') first."
        )
    if not sizes or not all(isinstance(size, dict) for size in sizes):
        raise ValueError("warm_up needs a list of sizes, e.g. [dict(height=480, width=832, num_frames=81)].")
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise ValueError(f"warm_up(workers={workers!r}) must be a positive number of concurrent builds.")

    def walk():
        for size in sizes:
            arguments = {**call, **size}
            arguments.setdefault("generator", torch.Generator().manual_seed(0))
            pipe(**arguments)

    start = time.perf_counter()
    with compile_accounting.compile_log() as log:
        if execute:
            walk()
        else:
            if workers is not None and workers > 1:
                with ThreadPoolExecutor(max_workers=workers) as pool, compile_only.compile_only(pool):
                    walk()  # every program lowered, built in the pool
            with compile_only.compile_only():
                walk()  # every program built: what runs between them compiles at the real shardings
    return {"programs": log.compilations, "seconds": round(time.perf_counter() - start, 2)}
