"""FirstBlockCache (``FirstBlockCacheConfig``) in the denoiser's program, decided inside it (``lax.cond``)."""

from __future__ import annotations

import contextlib

import jax
import jax.numpy as jnp
import numpy as np

from ....interop.backend import to_jax_array, wrap
from .base import StepCache


class FirstBlock(StepCache):
    """FirstBlockCache (``FirstBlockCacheConfig(threshold)``), decided inside the program."""

    head_name, block_name = "fbc_leader_block_hook", "fbc_block_hook"
    head_outside = True

    def __init__(self, lists: list, hooks: list):
        super().__init__(lists, hooks)
        self.has_encoder: dict = {}  # per program key: whether the blocks return text states too

    def _plan(self):
        kept = []
        for state in self.states:
            tails = state.tail_block_residuals
            kept.append(None if state.head_block_residual is None or tails is None else tails[1] is not None)
        self.kept = tuple(kept)
        self.inputs = [
            to_jax_array(t)
            for state, k in zip(self.states, kept)
            if k is not None
            for t in (state.head_block_residual, *state.tail_block_residuals)
            if t is not None
        ]
        self.key = ("first_block", len(self.contexts), self.kept, self.shapes())

    @contextlib.contextmanager
    def bound(self, arrays):
        values, self.previous = iter(arrays), []
        for k in self.kept:
            self.previous.append(None if k is None else (next(values), next(values), next(values) if k else None))
        yield

    def head_called(self, args, kwargs, out) -> None:
        """Block 0 ran: stock's test per context (``FBCHeadBlockHook._should_compute_remaining_blocks``)."""
        meta, hidden = self.metadata, self.argument("hidden_states", args, kwargs)
        is_tuple = isinstance(out, tuple)
        out_hidden = out[meta.return_hidden_states_index] if is_tuple else out
        residual = out_hidden - hidden
        self.head_out = [to_jax_array(out_hidden)]
        self.head_out.append(to_jax_array(out[meta.return_encoder_hidden_states_index]) if is_tuple else None)
        self.residual, self.decisions = to_jax_array(residual), []
        below = _largest_float32_at_most(self.head.threshold)
        for index, previous in enumerate(self.previous):
            if previous is None:
                self.decisions.append(None)  # no previous step: compute (stock: ``head_block_residual is None``)
                continue
            rows, kept = wrap(self.rows(self.residual, index)), wrap(previous[0])
            diff = (rows - kept).abs().mean() / kept.abs().mean()  # stock's expression; it compares ``.item()``
            self.decisions.append(to_jax_array(diff).astype(jnp.float32) > below)

    def chain(self, run, path: str):
        """A list's last block's call: the list's outputs, computed or (per context) what stock's hooks give at a skip:
        the head's output plus the kept tail residual out of the first list, each later list's inputs out of it."""
        inputs = None if path == self.path else self.list_inputs[path]
        last = path == self.paths[-1]

        def computed():
            return self._select(self.as_arrays(path, run()), inputs, last)

        if any(d is None for d in self.decisions):
            outputs, tails = computed()
        else:
            skipped = lambda: self._select(None, inputs, last)  # noqa: E731
            outputs, tails = jax.lax.cond(jnp.any(jnp.stack(self.decisions)), computed, skipped)
        if last:
            for index, decision in enumerate(self.decisions):  # the state stock leaves, per context
                previous = self.previous[index]
                head = self.rows(self.residual, index)
                self.returned.append(head if decision is None else jnp.where(decision, head, previous[0]))
                self.returned += [self.rows(t, index) for t in tails if t is not None]
                self.returned.append(jnp.asarray(True) if decision is None else decision)
            self.has_encoder[self.key] = self.head_out[1] is not None
        return self.as_output(path, *outputs)

    def _select(self, full, inputs, last: bool):
        """Per context: the computed rows (``full``: hidden and text states of all rows, or None when nothing was
        computed) where it decided to compute, else the skip's rows: the head's output plus the kept tail residual
        (``inputs`` None: the first list) or the list's inputs. With the tail residuals when ``last``."""
        parts = [[], []], [[], []]  # outputs (hidden, text), tails (hidden, text)
        for index, decision in enumerate(self.decisions):
            previous = self.previous[index]
            for which in (0, 1):
                head = self.head_out[which]
                if head is None:
                    continue
                head_rows = self.rows(head, index)
                new = None if full is None else self.rows(full[which], index)
                if decision is None:
                    out, tail = new, new - head_rows
                else:
                    kept = previous[1 + which]
                    skipped = head_rows + kept if inputs is None else self.rows(inputs[which], index)
                    out = skipped if new is None else jnp.where(decision, new, skipped)
                    tail = kept if new is None else jnp.where(decision, new - head_rows, kept)
                parts[0][which].append(out)
                parts[1][which].append(tail if last else None)
        joined = [[jnp.concatenate(p) if p and p[0] is not None else None for p in group] for group in parts]
        return joined[0], joined[1]

    def commit(self, arrays) -> list:
        """After the call: the new state into stock's objects; returns each context's computed flag (a device bool)."""
        values, flags = iter(arrays), []
        for state in self.states:
            state.head_block_residual = next(values)
            hidden = next(values)
            state.tail_block_residuals = (hidden, next(values) if self.has_encoder[self.key] else None)
            flags.append(to_jax_array(next(values)))
        return [(flag, len(self.blocks), 1) for flag in flags]


def _largest_float32_at_most(value: float) -> np.float32:
    """``x > value`` for a float32 ``x`` and a Python float, in float32: ``x > this`` (stock compares ``.item()``)."""
    found = np.float32(value)
    return np.nextafter(found, np.float32(-np.inf)) if float(found) > value else found
