"""FasterCache (``FasterCacheConfig``) in the denoiser's programs: its attention layers computing, or approximating
their output from the last two they kept (``t + (t - t_2) * weight``), decided on the host per call and kept stacked
over the layers.

Stock's hooks are two: ``faster_cache_denoiser`` on the denoiser itself, which runs as stock code around the
denoiser's entry (it hands the entry the conditional half of the batch on the steps it skips the unconditional one,
then rebuilds that half from the two halves' last low- and high-frequency difference: a few FFTs of the output, on
the devices, op by op), and ``faster_cache_block`` on each self-attention layer, played here. A layer approximates
when the schedule allows it and its batch is not the one it first saw (the unconditional half skipped) or the model
is guidance-distilled; that batch is known once the call is traced, so the plan predicts it from the call's argument
shapes (the call that set it, against this one) and the trace checks the prediction (else the unit route runs).

Stock keeps one state per hooked module, not per cache context: the guidance pair stays two calls (``pairs``)."""

from __future__ import annotations

import contextlib

import jax.numpy as jnp
import numpy as np
import torch

from ....interop.backend import to_jax_array, wrap
from ....interop.torch_private import pytree
from .base import LayerOutputs, NotInProgram
from .kept import Kept, real, stacked, structure


class FasterCache(LayerOutputs):
    """FasterCache's attention hooks on the layers of one or more block lists."""

    hook_name = "faster_cache_block"
    pairs = False

    def __init__(self, groups: list, hooks: list, loose: frozenset = frozenset()):
        super().__init__(groups, hooks, loose)
        self.first_call: dict = {}  # site -> the argument shapes of the call that set its layers' batch size

    @staticmethod
    def same(hook) -> tuple:
        return (
            hook.timestep_skip_range,
            hook.block_skip_range,
            hook.is_guidance_distilled,
            hook.current_timestep_callback,
        )

    def current_context(self):
        return None  # one state per hooked module, whatever the context

    def called_with(self, args, kwargs) -> None:
        leaves, _ = pytree.tree_flatten((args, kwargs))
        self.call_shapes = tuple(tuple(leaf.shape) for leaf in leaves if isinstance(leaf, torch.Tensor))

    def modules_at(self, site: str) -> list:
        return [self.module_at(site, layer) for layer in range(self.layers[site])]

    def plan(self, contexts: tuple) -> None:
        """``FasterCacheBlockHook.new_forward``'s decision per hooked layer kind, on stock's states, and the kept
        outputs and weights an approximating kind feeds the program."""
        self.contexts = contexts
        self.skips, self.approximates, self.batches, self.keys, self.inputs = [], [], [], [], []
        self.states = [h.state for h in self.found]
        self._saved = [dict(vars(s)) for s in self.states]
        for site in self.sites:
            hooks = self.at(self.found, site)
            states = [h.state for h in hooks]
            if len({(s.iteration, s.batch_size, s.cache is None) for s in states}) > 1:
                raise NotInProgram("FasterCache's hooked layers are not at the same iteration")
            hook, state = hooks[0], states[0]
            low, high = hook.timestep_skip_range
            within = bool(low < hook.current_timestep_callback() < high)
            skip = within and not (state.iteration > 0 and state.iteration % hook.block_skip_range == 0)
            other = self._other_batch(site, state)
            self.skips.append(skip)
            self.approximates.append(skip and (hook.is_guidance_distilled or other))
            self.batches.append(state.batch_size if other else None)  # None: the batch the layers first saw
            if self.approximates[-1]:
                self._feed(site, hooks, states)
        self.key = ("faster", tuple(self.approximates), tuple(self.batches), tuple(self.keys), self.shapes())
        self.key += (self.call_shapes,)

    def _other_batch(self, site: str, state) -> bool:
        """Whether this call's attention batch differs from the one the layers first saw (predicted from the calls'
        argument shapes; the trace checks it)."""
        if state.batch_size is None:
            return False  # this call sets it
        if site not in self.first_call:
            raise NotInProgram("FasterCache's batch size was set by a call the unit route ran")
        return self.first_call[site] != self.call_shapes

    def _feed(self, site: str, hooks: list, states: list) -> None:
        if states[0].cache is None:  # guidance-distilled, skipping at its first call: stock's own error in units
            raise NotInProgram("FasterCache approximates before it kept an output")
        for name, views in (("t2", [s.cache[0] for s in states]), ("t", [s.cache[1] for s in states])):
            for index, array in enumerate(stacked(views)):
                self.keys.append((site, name, index))
                self.inputs.append(array)
        count, single, _ = structure(states[0].cache[-1])
        weights = [  # stock asks once per approximated output tensor
            [float(h.weight_callback(m)) for _ in range(1 if single else count)]
            for h, m in zip(hooks, self.modules_at(site))
        ]
        for index in range(count):
            self.keys.append((site, "w", index))
            self.inputs.append(jnp.asarray(np.asarray([w[0 if single else index] for w in weights], np.float32)))

    def hand_back(self) -> None:
        """Before the unit route takes over: stock's states hold real tensors again."""
        for hook in self.found:
            if hook.state.cache is not None:
                hook.state.cache = [real(value) for value in hook.state.cache]

    @contextlib.contextmanager
    def bound(self, arrays):
        self.stacked = dict(zip(self.keys, arrays))
        yield

    def module_called(self, site, kept, produced, original, args, kwargs):
        """A hooked layer's call: computed, or approximated from its last two kept outputs; what it keeps (the
        conditional half of a full batch) is produced for the next call."""
        place = self.sites.index(site)
        hook = self.at(self.found, site)[0]
        tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
        batch, first = tensors[0].size(0), self.at(self.states, site)[0].batch_size
        if (first is not None and first != batch) != (self.batches[place] is not None):
            raise NotInProgram("FasterCache's attention batch is not the one its call's shapes predicted")
        first = self.batches[place] or batch
        if self.approximates[place]:
            count = sum(1 for key in kept if key[:2] == (site, "t"))
            leaves = [wrap(_approximated(kept, site, index, batch)) for index in range(count)]
            _, single, kind = structure(self.at(self.states, site)[0].cache[-1])
            out = leaves[0] if single else kind(leaves)
        else:
            out = original(*args, **kwargs)
        single = isinstance(out, torch.Tensor)
        self.seen[site] = single, type(out), batch
        for index, leaf in enumerate([out] if single else out):
            if not hook.is_guidance_distilled and leaf.size(0) == first:
                leaf = leaf.chunk(2, dim=0)[1]
            produced[(site, index)] = to_jax_array(leaf)
        return out

    def commit(self, arrays) -> list:
        """After the call: each layer keeps its last two outputs (views of the program's), stock's counters set."""
        seen, order = self.traced_meta[self.key]
        new = dict(zip(order, (to_jax_array(a) for a in arrays)))
        computed = 0
        for site, approximate in zip(self.sites, self.approximates):
            single, kind, batch = seen[site]
            for layer, hook in enumerate(self.at(self.found, site)):
                state = hook.state
                if state.batch_size is None:
                    state.batch_size = batch
                    self.first_call[site] = self.call_shapes
                view = Kept(new, site, layer, single, kind)
                state.cache = [view, view] if state.cache is None else [state.cache[-1], view]
                state.iteration += 1
                computed += not approximate
        return [(True, computed, computed)]


def _approximated(kept: dict, site: str, index: int, batch: int):
    """``FasterCacheBlockHook._compute_approximated_attention_output``: the kept outputs' last rows when they hold
    the whole batch (a guidance-distilled model's), extrapolated by the layer's weight."""
    t_2, t = kept[(site, "t2", index)], kept[(site, "t", index)]
    t_2, t = (x[batch:] if x.shape[0] != batch else x for x in (t_2, t))
    return t + (t - t_2) * kept[(site, "w", index)].astype(t.dtype)
