"""Pyramid Attention Broadcast (``PyramidAttentionBroadcastConfig``) in the denoiser's programs: its schedule decided on
the host per call, each hooked attention layer computing or giving back its kept output, kept stacked over the layers.

Stock keeps one state per hooked module, not per cache context: in a guidance loop the uncond call reuses what the
cond call computed. The pair therefore stays two calls (``pairs = False``): batched, the program would compute the
half stock skips."""

from __future__ import annotations

import contextlib

import jax.numpy as jnp
import torch

from ....interop.backend import to_jax_array, wrap
from .base import LayerOutputs, NotInProgram, hooked_layers


class PyramidAttention(LayerOutputs):
    """PAB on the attention modules it hooked inside the blocks of one or more lists."""

    hook_name = "pyramid_attention_broadcast"
    pairs = False

    @classmethod
    def recognize(cls, module, hooks: dict):
        found = hooked_layers(module, hooks, cls.hook_name)
        if found is None:
            return None
        cache = cls(*found)
        for site in cache.sites:
            same = cache.at(cache.found, site)
            if len({(h.timestep_skip_range, h.block_skip_range, h.current_timestep_callback) for h in same}) > 1:
                return None
        return cache

    def current_context(self):
        return None  # one state per hooked module, whatever the context

    def plan(self, contexts: tuple) -> None:
        """``PyramidAttentionBroadcastHook.new_forward``'s decision per hooked layer kind, on stock's states."""
        self.contexts, self.modes, self.keys, self.inputs = contexts, [], [], []
        self.states = [h.state for h in self.found]
        self._saved = [dict(vars(s)) for s in self.states]
        for site in self.sites:
            hooks = self.at(self.found, site)
            states = [h.state for h in hooks]
            if len({(s.iteration, s.cache is None) for s in states}) > 1:
                raise NotInProgram("Pyramid Attention Broadcast's hooked layers are not at the same iteration")
            hook, state = hooks[0], states[0]
            low, high = hook.timestep_skip_range
            within = low < hook.current_timestep_callback() < high
            compute = state.cache is None or state.iteration == 0 or not within
            compute = bool(compute or state.iteration % hook.block_skip_range == 0)
            self.modes.append(compute)
            if not compute:
                for index, array in enumerate(_stacked(states)):
                    self.keys.append((site, index))
                    self.inputs.append(array)
        self.key = ("pyramid", tuple(self.modes), tuple(self.keys), self.shapes())

    def undo_plan(self) -> None:
        for state, saved in zip(self.states, self._saved):
            vars(state).clear()
            vars(state).update(saved)

    def hand_back(self) -> None:
        """Before the unit route takes over: stock's states hold real tensors again."""
        for state in self.states:
            if isinstance(state.cache, _Kept):
                state.cache = state.cache.tensor()

    @contextlib.contextmanager
    def bound(self, arrays):
        self.stacked = dict(zip(self.keys, arrays))
        yield

    def module_called(self, site, kept, produced, original, args, kwargs):
        if self.modes[self.sites.index(site)]:
            out = original(*args, **kwargs)
            leaves = [out] if isinstance(out, torch.Tensor) else list(out)
            self.seen[site] = isinstance(out, torch.Tensor), type(out)
            for index, leaf in enumerate(leaves):
                produced[(site, index)] = to_jax_array(leaf)
            return out
        count, single, kind = _structure(self.at(self.found, site)[0].state.cache)
        leaves = [wrap(kept[(site, index)]) for index in range(count)]
        return leaves[0] if single else kind(leaves)

    def commit(self, arrays) -> list:
        structure, order = self.traced_meta[self.key]
        new = dict(zip(order, (to_jax_array(a) for a in arrays)))
        computed = 0
        for site, compute in zip(self.sites, self.modes):
            for layer, hook in enumerate(self.at(self.found, site)):
                if compute:
                    single, kind = structure[site]
                    hook.state.cache = _Kept(new, site, layer, single, kind)
                    computed += 1
                hook.state.iteration += 1
        return [(True, computed, computed)]


def _stacked(states) -> list:
    """The layers' kept outputs, ``[layers, ...]`` per output: this cache's arrays when stock's states still hold its
    views of them, else stacked from stock's own tensors (the unit route ran last)."""
    views = [s.cache for s in states]
    if all(isinstance(v, _Kept) and v.store is views[0].store for v in views):
        first = views[0]
        return [first.store[(first.site, index)] for index in range(first.count)]
    leaves = [[v] if isinstance(v, torch.Tensor) else list(v) for v in views]
    return [jnp.stack([to_jax_array(layer[index]) for layer in leaves]) for index in range(len(leaves[0]))]


def _structure(cache) -> tuple:
    """A kept output's (number of tensors, a lone tensor?, container type): this cache's view, or stock's value."""
    if isinstance(cache, _Kept):
        return cache.count, cache.single, cache.kind
    if isinstance(cache, torch.Tensor):
        return 1, True, tuple
    return len(cache), False, type(cache)


class _Kept:
    """Stock's ``state.cache`` of one layer while the program route runs: a view of the stacked arrays (``tensor()``
    makes it the tensor stock keeps; ``shape`` and ``dtype`` for stock's ``repr``)."""

    def __init__(self, store: dict, site: str, layer: int, single: bool, kind: type):
        self.store, self.site, self.layer, self.single, self.kind = store, site, layer, single, kind
        self.count = sum(1 for r, _ in store if r == site)
        first = store[(site, 0)]
        self.shape, self.dtype = tuple(first.shape[1:]), first.dtype

    def tensor(self):
        leaves = [wrap(self.store[(self.site, index)][self.layer]) for index in range(self.count)]
        return leaves[0] if self.single else self.kind(leaves)
