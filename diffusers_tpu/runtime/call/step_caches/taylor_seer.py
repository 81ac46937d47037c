"""TaylorSeer (``TaylorSeerCacheConfig``) in the denoiser's programs: its schedule decided on the host (two programs:
computing, predicting), the hooked modules' Taylor factors kept on the devices, stacked over the layers."""

from __future__ import annotations

import contextlib
import math

import jax.numpy as jnp
import numpy as np
import torch

from ....interop.backend import jax_dtype, jax_torch_device, to_jax_array, wrap
from ... import diffusers_private
from .base import LayerOutputs, NotInProgram, hooked_layers


class TaylorSeer(LayerOutputs):
    """TaylorSeer on the modules it hooked inside the blocks of one or more lists (by default the attention layers)."""

    hook_name = "taylorseer_cache"

    @classmethod
    def recognize(cls, module, hooks: dict):
        found = hooked_layers(module, hooks, cls.hook_name)
        if found is None:
            return None
        stock = found[1]
        settings = {(h.cache_interval, h.disable_cache_before_step, h.disable_cache_after_step) for h in stock}
        return cls(*found) if len(settings) == 1 else None

    def plan(self, contexts: tuple) -> None:
        """Stock's step count and decision per context (``TaylorSeerCacheHook._measure_should_compute``), the same for
        every hooked module, and the factors each context feeds the program."""
        self.contexts = contexts
        self.states = [[diffusers_private.cache_state(h.state_manager, c) for h in self.found] for c in contexts]
        for row in self.states:
            if len({(s.current_step, s.last_update_step) for s in row}) > 1:
                raise NotInProgram("TaylorSeer's hooked modules are not at the same step")
        self._saved = [[dict(vars(s)) for s in row] for row in self.states]
        kept = [self._kept(row) for row in self.states]
        hook, self.modes, scalars = self.found[0], [], []
        for row, factors in zip(self.states, kept):
            for state in row:
                state.current_step += 1
            step, last = row[0].current_step, row[0].last_update_step
            before, after = hook.disable_cache_before_step, hook.disable_cache_after_step
            compute = step < before or (step - before - 1) % hook.cache_interval == 0
            compute = compute or (after is not None and step >= after)
            if not compute and last is None:
                raise ValueError("Cannot predict without prior initialization/update.")  # stock's error
            self.modes.append(compute)
            orders = max([k for _, _, k in factors] + [0]) + 1
            offset = step - (last if last is not None else step)
            scalars.append(
                np.float32(offset)
                if compute
                else np.asarray([offset**k / math.factorial(k) for k in range(orders)], np.float32)
            )
        self.inactive = {site: self.at(self.states[0], site)[0].is_inactive for site in self.sites}
        # a computing context's old factors last: the call replaces them, so the program may reuse their memory
        keys = [(c, *key) for c, factors in enumerate(kept) for key in sorted(factors)]
        self.keys = sorted(keys, key=lambda key: (self.modes[key[0]], key))
        self.donated = sum(self.modes[key[0]] for key in self.keys)
        self.inputs = [jnp.asarray(s) for s in scalars] + [kept[key[0]][key[1:]] for key in self.keys]
        self.had = [row[0].last_update_step is not None for row in self.states]
        self.key = ("taylor_seer", len(self.contexts), tuple(self.modes), tuple(self.keys), self.shapes())

    @property
    def carried(self) -> frozenset:
        """The old factors this call replaces (the computing contexts', last in ``keys``): the new written over them."""
        return frozenset(self.keys[len(self.keys) - self.donated :])

    def _kept(self, row) -> dict:
        """One context's factors, ``(site, output, order) -> [layers, ...]``: the arrays this cache kept when stock's
        state objects still hold its views of them, else stacked from stock's own tensors."""
        views = [s.taylor_factors for s in row]
        if views and all(isinstance(v, _LayerFactors) and not v.edited and v.store is views[0].store for v in views):
            if any(array.is_deleted() for array in views[0].store.values()):
                raise RuntimeError(
                    "TaylorSeer's factors were handed to a denoiser call that did not finish (their memory is reused "
                    "by the call that replaces them). Start the cache afresh: pipe.transformer.disable_cache(), then "
                    "pipe.transformer.enable_cache(your TaylorSeerCacheConfig)."
                )
            return views[0].store
        found = {}
        for site in self.sites:
            layers = self.at(row, site)
            structure = {(i, k) for i, orders in layers[0].taylor_factors.items() for k in orders}
            if any({(i, k) for i, o in s.taylor_factors.items() for k in o} != structure for s in layers):
                raise NotInProgram("TaylorSeer's hooked modules keep different factors")
            for i, k in structure:
                found[(site, i, k)] = jnp.stack([to_jax_array(s.taylor_factors[i][k]) for s in layers])
        return found

    def undo_plan(self) -> None:
        for row, saved_row in zip(self.states, self._saved):
            for state, saved in zip(row, saved_row):
                vars(state).clear()
                vars(state).update(saved)

    def state_of(self, c: int, site: str, layer: int = 0):
        return self.states[c][self.index[(site, layer)]]

    @contextlib.contextmanager
    def bound(self, arrays):
        split = len(self.contexts)
        self.scalars = list(arrays[:split])
        self.stacked = dict(zip(self.keys, arrays[split:]))
        yield

    def module_called(self, site, kept, produced, original, args, kwargs):
        """A hooked module's call: stock's compute (its output, new factors) or prediction, per context's rows."""
        out = original(*args, **kwargs) if any(self.modes) else None
        outputs = [out] if isinstance(out, torch.Tensor) else list(out) if out is not None else None
        per_output = []
        for c, compute in enumerate(self.modes):
            state = self.state_of(c, site)
            if compute:
                rows = [self.rows(to_jax_array(o), c) for o in outputs]
                self.seen[site] = [(tuple(r.shape), o.dtype) for r, o in zip(rows, outputs)]
                if not self.inactive[site]:
                    self._update(c, site, rows, kept, produced, state)
            elif self.inactive[site]:
                shapes, dtypes = state.inactive_shapes, state.module_dtypes
                rows = [jnp.zeros(tuple(s), jax_dtype(d)) for s, d in zip(shapes, dtypes)]
            else:
                rows = self._predict(c, site, kept)
            per_output.append(rows)
        if all(self.modes):
            return out
        joined = [wrap(jnp.concatenate(parts)) for parts in zip(*per_output)]
        if outputs is None:  # every context predicts: stock returns one tensor, or a tuple
            return joined[0] if len(joined) == 1 else tuple(joined)
        return joined[0] if isinstance(out, torch.Tensor) else type(out)(joined)

    def _update(self, c, site, rows, kept, produced, state) -> None:
        """``TaylorSeerState.update``: order 0 the output, order j+1 order j's change per step since the last update."""
        target = state.taylor_factors_dtype
        for i, features in enumerate(rows):
            new = [features]
            if self.had[c]:
                for j in range(state.max_order):
                    previous = kept.get((c, site, i, j))
                    if previous is None or previous.shape != new[j].shape:
                        break
                    difference = new[j] - previous.astype(features.dtype)
                    new.append((difference.astype(jnp.float32) / self.scalars[c]).astype(features.dtype))
            for k, factor in enumerate(new):
                produced[(c, site, i, k)] = factor if target is None else factor.astype(jax_dtype(target))

    def _predict(self, c, site, kept) -> list:
        """``TaylorSeerState.predict``: the sum of the factors times offset**k / k!, in the module's output dtype."""
        dtypes = [jax_dtype(d) for d in self.state_of(c, site).module_dtypes]
        results = []
        for i, dtype in enumerate(dtypes):
            orders = sorted(k for cc, r, ii, k in kept if (cc, r, ii) == (c, site, i))
            output = jnp.zeros(kept[(c, site, i, 0)].shape, dtype)
            for k in orders:
                term = kept[(c, site, i, k)].astype(dtype).astype(jnp.float32) * self.scalars[c][k]
                output = output + term.astype(dtype)
            results.append(output)
        return results

    def commit(self, arrays) -> list:
        """After the call: the new factors kept (stock's states hold views of them), stock's counters set."""
        meta, order = self.traced_meta[self.key]
        new = dict(zip(order, (to_jax_array(a) for a in arrays)))
        passes = []
        for c, (row, compute) in enumerate(zip(self.states, self.modes)):
            passes.append((compute, len(self.found), 0))
            if not compute:
                continue
            store = {key[1:]: array for key, array in new.items() if key[0] == c}
            for site in self.sites:
                shapes, dtypes = zip(*meta[site])
                for layer, state in enumerate(self.at(row, site)):
                    state.module_dtypes = tuple(dtypes)
                    state.device = jax_torch_device()
                    if state.is_inactive:
                        state.inactive_shapes = tuple(torch.Size(s) for s in shapes)
                    else:
                        state.taylor_factors = _LayerFactors(store, site, layer)
                    state.last_update_step = state.current_step
        return passes


class _LayerFactors(dict):
    """Stock's ``taylor_factors`` of one layer's module, ``{output: {order: tensor}}``, read from the cache's stacked
    arrays only when stock code reads it (the unit route after a fallback, a user's look): else nothing is sliced."""

    def __init__(self, store: dict, site: str, layer: int):
        super().__init__()
        self.store, self.site, self.layer, self.filled, self.edited = store, site, layer, False, False

    def _fill(self):
        if not self.filled:
            self.filled = True
            for (site, i, k), array in self.store.items():
                if site == self.site:
                    dict.setdefault(self, i, {})[k] = wrap(array[self.layer])

    def __setitem__(self, key, value):
        self._fill()
        self.edited = True
        dict.__setitem__(self, key, value)

    def _read(name):  # noqa: N805 - builds the reading methods below: each fills the dict first
        def read(self, *args):
            self._fill()
            return getattr(dict, name)(self, *args)

        return read

    __getitem__, __contains__, __iter__, __len__ = (
        _read("__getitem__"),
        _read("__contains__"),
        _read("__iter__"),
        _read("__len__"),
    )
    __repr__, get, items, keys, values = _read("__repr__"), _read("get"), _read("items"), _read("keys"), _read("values")
    del _read
