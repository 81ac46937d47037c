"""Step caches whose hooks sit on submodules of every block (TaylorSeer's attention layers): what each layer's hooked
modules keep, stacked over the layers, fed to the block loop as its per-layer inputs and returned as its outputs."""

from __future__ import annotations

import contextlib

import jax.numpy as jnp

from ... import diffusers_private
from .base import StepCache, child_block_lists


def hooked_layers(module, hooks: dict, name: str):
    """``(path, blocks, rels, hooks)`` when every module in ``hooks`` carries only the hook ``name`` and they sit at
    the same relative paths (``rels``) inside every block of one block list of ``module``; else None. ``hooks`` (the
    stock hook objects) are ordered by relative path, then layer."""
    if any(names != [name] for names in hooks.values()):
        return None
    for path, blocks in child_block_lists(module):
        where = {id(m): (rel, layer) for layer, b in enumerate(blocks) for rel, m in b.named_modules() if rel}
        if len(blocks) < 2 or any(id(m) not in where for m in hooks):
            continue
        rels = sorted({where[id(m)][0] for m in hooks})
        if len(hooks) != len(rels) * len(blocks):
            return None  # not the same modules hooked in every block
        found = [diffusers_private.hook_registry(b.get_submodule(rel)).hooks[name] for rel in rels for b in blocks]
        return path, blocks, rels, found
    return None


class LayerOutputs(StepCache):
    """A cache over hooked submodules (``rels``) of every block: their kept arrays are keyed by a tuple and stacked
    over the layers; the block loop reads one layer's slice (``layer``) and returns what the layer produced."""

    def __init__(self, path: str, blocks: list, rels: list, hooks: list):
        super().__init__(path, blocks, hooks)
        self.rels, self.found = rels, hooks
        self.by_module = {id(b.get_submodule(rel)): (rel, layer) for rel in rels for layer, b in enumerate(blocks)}
        self.stacked: dict = {}  # while tracing: key -> the [layers, ...] array bound for this call
        self.current = None  # while the loop's body is traced: key -> that layer's array
        self.produced: dict = {}  # what the layer being traced produced: key -> array
        self.outside: dict = {}  # layer -> what it produced, for layers called outside the loop (block 0)
        self.loop = None  # (first layer, key -> [layers, ...]) the loop produced
        self.traced_meta: dict = {}  # per program key: what the trace found (outputs' structure, new arrays' keys)

    @contextlib.contextmanager
    def hooks_set_aside(self):
        """The hooked modules run this file's part while traced (their stock hooks set aside)."""
        saved = []
        for rel in self.rels:
            for block in self.blocks:
                module = block.get_submodule(rel)
                reference, attribute = diffusers_private.innermost_forward_reference(module)
                original = getattr(reference, attribute)
                saved.append(
                    (module, {k: vars(module).pop(k) for k in ("forward", "_diffusers_hook") if k in vars(module)})
                )
                part = self._part(module, original)
                part._diffusers_tpu_same_in_every_block = True  # a block's signature accepts it (``block_signature``)
                vars(module)["forward"] = part
        self.traced, self.outside, self.loop = True, {}, None
        try:
            yield
        finally:
            self.traced = False
            for module, attributes in saved:
                vars(module).pop("forward", None)
                vars(module).update(attributes)

    def _part(self, module, original):
        rel, layer = self.by_module[id(module)]

        def part(*args, **kwargs):
            if self.current is not None:  # the loop's body: the template block's module, the loop's layer
                return self.module_called(rel, self.current, self.produced, original, args, kwargs)
            kept = {key: array[layer] for key, array in self.stacked.items()}
            return self.module_called(rel, kept, self.outside.setdefault(layer, {}), original, args, kwargs)

        return part

    # what ``repeated_blocks`` asks of a cache with per-layer state
    def layer_inputs(self, layers: range) -> dict:
        return {key: array[layers.start :] for key, array in self.stacked.items()}

    @contextlib.contextmanager
    def layer(self, kept: dict):
        self.current, self.produced = kept, {}
        try:
            yield
        finally:
            self.current = None

    def layer_outputs(self) -> dict:
        return dict(self.produced)

    def loop_outputs(self, layers: range, produced: dict) -> None:
        self.loop = (layers.start, produced)

    def chain(self, run):
        out = run()
        start, produced = self.loop
        new = {}
        for key, array in produced.items():
            new[key] = array if start == 0 else jnp.concatenate([self.outside[0][key][None], array])
        self.produced_stacked = new
        return out

    def module_called(self, rel: str, kept: dict, produced: dict, original, args, kwargs):
        raise NotImplementedError
