"""Pyramid Attention Broadcast (``PyramidAttentionBroadcastConfig``) in the denoiser's programs: its schedule decided on
the host per call, each hooked attention layer computing or giving back its kept output, kept stacked over the layers.

Stock keeps one state per hooked module, not per cache context: in a guidance loop the uncond call reuses what the
cond call computed. The pair therefore stays two calls (``pairs = False``): batched, the program would compute the
half stock skips."""

from __future__ import annotations

import contextlib

import torch

from ....interop.backend import to_jax_array, wrap
from .base import LayerOutputs, NotInProgram
from .kept import Kept, real, stacked, structure


class PyramidAttention(LayerOutputs):
    """PAB on the attention modules it hooked inside the blocks of one or more lists."""

    hook_name = "pyramid_attention_broadcast"
    pairs = False

    @staticmethod
    def same(hook) -> tuple:
        return hook.timestep_skip_range, hook.block_skip_range, hook.current_timestep_callback

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
                for index, array in enumerate(stacked([s.cache for s in states])):
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
            state.cache = real(state.cache)

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
        count, single, kind = structure(self.at(self.found, site)[0].state.cache)
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
                    hook.state.cache = Kept(new, site, layer, single, kind)
                    computed += 1
                hook.state.iteration += 1
        return [(True, computed, computed)]
