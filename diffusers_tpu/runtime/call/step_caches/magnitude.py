"""MagCache (``MagCacheConfig``) in the denoiser's programs: its schedule decided on the host, one of two programs.
Calibration (``calibrate=True``) computes every step, the program giving stock's ratio of the residual's magnitude to
the last step's beside it (one scalar read a step, as stock's ``.item()``)."""

from __future__ import annotations

import contextlib

import jax.numpy as jnp

from ....interop.backend import to_jax_array, wrap
from ... import diffusers_private
from .base import StepCache


class Magnitude(StepCache):
    """MagCache (``MagCacheConfig``), its schedule decided on the host."""

    head_name, block_name = "mag_cache_leader_block_hook", "mag_cache_block_hook"

    def current_context(self) -> str:
        if diffusers_private.context_name(self.manager) is None:  # as stock's head hook does
            diffusers_private.set_cache_context(self.manager, "inference")
        return diffusers_private.context_name(self.manager)

    def _plan(self):
        self.compute = tuple(self._decide(state) for state in self.states)
        calibrate = self.head.config.calibrate
        # what each context reads: the kept residual, to add it (skipping) or to measure against it (calibrating)
        self.reads = tuple(
            s.previous_residual is not None and (calibrate or not c) for s, c in zip(self.states, self.compute)
        )
        self.inputs = [to_jax_array(s.previous_residual) for s, r in zip(self.states, self.reads) if r]
        self.key = ("mag", len(self.contexts), self.compute, self.reads, self.shapes())

    def _decide(self, state) -> bool:
        """``MagCacheHeadHook.new_forward``'s decision (diffusers 0.42), on stock's state: the same arithmetic."""
        config, step = self.head.config, state.step_index
        if config.calibrate:  # never skips
            state.should_compute = True
            return True
        scale = 1.0 if step >= len(config.mag_ratios) else config.mag_ratios[step]
        if step < int(config.retention_ratio * config.num_inference_steps + 0.5):
            compute = True
        else:
            state.accumulated_ratio *= scale
            state.accumulated_steps += 1
            state.accumulated_err += abs(1.0 - state.accumulated_ratio)
            compute = not (
                state.previous_residual is not None
                and state.accumulated_err <= config.threshold
                and state.accumulated_steps <= config.max_skip_steps
            )
            if compute:
                state.accumulated_ratio, state.accumulated_steps, state.accumulated_err = 1.0, 0, 0.0
        state.should_compute = compute
        return compute

    @contextlib.contextmanager
    def bound(self, arrays):
        values = iter(arrays)
        self.previous = [next(values) if r else None for r in self.reads]
        yield

    def skips_all(self) -> bool:
        return not any(self.compute)

    def _skipped(self, hidden, index):
        """Stock's skip for one context's rows: the head's input plus the kept residual."""
        residual = self.previous[index]
        if residual.shape == hidden.shape:
            return hidden + residual
        if hidden.ndim == 3 and residual.ndim == 3 and hidden.shape[0] == residual.shape[0]:
            if hidden.shape[2] == residual.shape[2] and hidden.shape[1] > residual.shape[1]:
                start = hidden.shape[1] - residual.shape[1]  # text + image tokens: the image part is at the end
                return hidden.at[:, start:].add(residual)
        return hidden  # stock warns and returns the input unchanged

    def passthrough(self, path: str, index: int, args, kwargs):
        """A block's call when every context skips: stock's head and block hooks' skip outputs (the head adds the
        kept residual; every other block gives back its inputs)."""
        meta = self.list_metadata[path]
        hidden = self.argument(meta.hidden_states_argument_name, args, kwargs, meta)
        if index == 0 and path == self.path:
            array = to_jax_array(hidden)
            hidden = wrap(jnp.concatenate([self._skipped(self.rows(array, c), c) for c in range(len(self.contexts))]))
        if meta.return_encoder_hidden_states_index is None:
            return hidden
        return self.as_output(
            path, to_jax_array(hidden), to_jax_array(self.argument("encoder_hidden_states", args, kwargs, meta))
        )

    def head_called(self, args, kwargs, out) -> None:
        meta = self.metadata
        self.head_in = to_jax_array(self.argument(meta.hidden_states_argument_name, args, kwargs))
        text = meta.return_encoder_hidden_states_index is not None
        self.text_in = to_jax_array(self.argument("encoder_hidden_states", args, kwargs)) if text else None

    def chain(self, run, path: str):
        """A list ran (for the contexts that compute; the last list's output minus the head's input kept); a
        skipping context's rows: the head's input plus the kept residual out of the first list (its text states as
        they came in), each later list's inputs out of it."""
        hidden, text = self.as_arrays(path, run())
        inputs = [self.head_in, self.text_in] if path == self.path else self.list_inputs[path]
        hiddens, texts = [], []
        for index, compute in enumerate(self.compute):
            rows, head_in = self.rows(hidden, index), self.rows(self.head_in, index)
            if compute:
                if path == self.paths[-1]:
                    self.returned.append(_residual(rows, head_in))
                    if self.head.config.calibrate and self.previous[index] is not None:
                        self.returned.append(_ratio(self.returned[-1], self.previous[index]))
                hiddens.append(rows)
                texts.append(None if text is None else self.rows(text, index))
            else:
                skipped = self._skipped(head_in, index) if path == self.path else self.rows(inputs[0], index)
                hiddens.append(skipped)
                texts.append(None if text is None or inputs[1] is None else self.rows(inputs[1], index))
        joined_text = None if text is None or any(t is None for t in texts) else jnp.concatenate(texts)
        return self.as_output(path, jnp.concatenate(hiddens), joined_text)

    def commit(self, arrays) -> list:
        values, passes = iter(arrays), []
        for state, compute, read in zip(self.states, self.compute, self.reads):
            if compute:
                state.previous_residual = next(values)
                if self.head.config.calibrate:  # stock's first step logs 1.0: nothing to compare with
                    state.calibration_ratios.append(float(to_jax_array(next(values))) if read else 1.0)
            diffusers_private.advance_mag_cache_step(self.tail, state)  # stock's counter and end-of-schedule reset
            passes.append((compute, len(self.blocks), 0))
        return passes


def _ratio(residual, previous):
    """``MagCacheBlockHook._perform_calibration_step``: the mean over tokens of the residual's magnitude over the last
    step's."""
    current = jnp.linalg.norm(residual.astype(jnp.float32), axis=-1)
    return jnp.mean(current / (jnp.linalg.norm(previous.astype(jnp.float32), axis=-1) + 1e-8))


def _residual(out, head_in):
    """``MagCacheBlockHook``'s residual of the tail's output against the head's input (diffusers 0.42)."""
    if out.shape == head_in.shape:
        return out - head_in
    if out.ndim == 3 and head_in.ndim == 3 and out.shape[2] == head_in.shape[2]:
        return out[:, -head_in.shape[1] :] - head_in  # the tail returned text + image tokens; the image at the end
    return out
