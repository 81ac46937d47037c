"""diffusers' step caches inside the denoiser's whole-step program: FirstBlockCache, MagCache, SeaCache, TaylorSeer,
Pyramid Attention Broadcast, FasterCache and TextKVCache.

Stock cache hooks (``transformer.enable_cache(...)``) decide per call, in Python, which blocks run. For the caches
recognized here the denoiser still runs ONE program per call (``denoiser.Denoiser``): its blocks one loop
(``repeated_blocks``), the guidance pair batched over ``dp``; the rows of each cache context ("cond", "uncond") keep
their own state, as stock's contexts do. While the program is traced the hooks are set aside and this package
plays their part:

- **FirstBlockCache** decides from data: the head block runs; stock's test (the relative change of its residual
  against the last computed step's, per context) decides INSIDE the program (``lax.cond``) whether the other blocks
  run or the tail residual kept from the last computed step is added. Its state stays on the devices (program input
  and output); a step's decisions reach the host only when read (``PassLog.counts``).
- **MagCache** decides from the schedule: stock's accumulators advance on the host (its arithmetic, on its state
  objects) and pick one of two programs: every block (their residual kept) or the input plus the kept residual.

- **TaylorSeer** and **Pyramid Attention Broadcast** hook submodules of every block (the attention layers): their
  schedule picks a program on the host (compute, or predict / reuse), and what each layer's modules keep is stacked
  over the layers, the block loop's per-layer input and output (``base.LayerOutputs``). PAB's state is shared by the two
  guidance passes in stock (the uncond pass reuses the cond pass's attention), so its pair stays two calls.
- **SeaCache** as MagCache (two programs; the residual extrapolated from the last two at ``residual_order=1``), its
  decision made before the call by stock's own gate on the input latents' filtered spectrum (``magnitude``).
- **FasterCache**'s attention hooks the same way (compute, or extrapolate from the last two kept outputs; its state
  shared by the passes too); its hook on the denoiser itself stays stock code around the entry (``faster``).
- **TextKVCache** keeps each block's text keys and values per prompt, stacked over the layers: computed by the first
  program that sees the prompt, read by the others (``text_kv``); keyed by the text states, not by context, so the
  pair shares a call even where the loop names no contexts.

Every cache here may span several block lists (Flux's double- and single-stream blocks), each list one loop:
FirstBlockCache's and MagCache's head in the first list, their tail residual after the last, a skip passing the
later lists their inputs (stock's block hooks give their inputs back); TaylorSeer's, PAB's and FasterCache's arrays per
list (or per layer, the blocks unrolled, where they cannot be one loop). Any other hook (a custom one)
keeps the unit route (``denoiser``): slower, the same result. MagCache's calibration runs in programs too.
"""

from __future__ import annotations

import torch

from ... import diffusers_private
from .base import NotInProgram, child_block_lists
from .calls import Extras, PassLog, batched_contexts, batched_rows
from .faster import FasterCache
from .first_block import FirstBlock
from .magnitude import Magnitude, SeaCache
from .pyramid import PyramidAttention
from .taylor_seer import TaylorSeer
from .text_kv import TextKV

__all__ = [
    "Extras",
    "FasterCache",
    "FirstBlock",
    "Magnitude",
    "NotInProgram",
    "PassLog",
    "PyramidAttention",
    "SeaCache",
    "TaylorSeer",
    "TextKV",
    "batched_contexts",
    "batched_rows",
    "recognize",
]


def recognize(module: torch.nn.Module, hooks: dict):
    """The step cache behind ``hooks`` ({submodule: [hook names]}, the denoiser's own excluded) when one of the caches
    here alone put them there, on the block lists of ``module``; else None (the unit route)."""
    hooked = {id(m) for m in hooks}
    lists = [(p, blocks) for p, blocks in child_block_lists(module) if any(id(b) in hooked for b in blocks)]
    blocks = [b for _, found in lists for b in found]
    if lists and {id(b) for b in blocks} == hooked and all(len(found) >= 2 for _, found in lists):
        names = [hooks[b] for b in blocks]
        for kind in (FirstBlock, Magnitude, SeaCache):
            if names == [[kind.head_name]] + [[kind.block_name]] * (len(blocks) - 1):
                found = [diffusers_private.hook_registry(b).hooks[n[0]] for b, n in zip(blocks, names)]
                return kind(lists, found) if kind.accepts(found[0]) else None
    for kind in (TaylorSeer, PyramidAttention, FasterCache, TextKV):
        found = kind.recognize(module, hooks)
        if found is not None:
            return found
    return None
