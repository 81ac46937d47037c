"""MagCache (``MagCacheConfig``) and SeaCache (``SeaCacheConfig``) in the denoiser's programs: each call one of two
programs, decided on the host — every block (their residual kept), or the head block's input plus the kept residual.

MagCache's schedule is stock's arithmetic on its state objects. Its calibration (``calibrate=True``) computes every
step, the program giving stock's ratio of the residual's magnitude to the last step's beside it (one scalar read a
step, as stock's ``.item()``).

SeaCache keeps the last one or two residuals and extrapolates over the steps from the last two
(``residual_order=1``). Stock decides in its leader block hook from the call's input latents alone (their spectrum
filtered at the call's sigma, against the last call's: the accumulated relative change under ``threshold``), so the
decision is made before the program runs, by stock's own code: the indicator's FFTs run op by op on the devices and
stock's gate reads one distance a call to the host, as stock does. Its root hook on the denoiser itself (the
scheduler's step and sigma from the cache context, the input latents) runs as stock code around the entry. The pair
shares a call as with MagCache: each context's gate reads the "cond" call's step, sigma and latents — the same as
the "uncond" call's in stock loops; the batching takes only an "uncond" call with the batched latents, and one whose
context carries another step or sigma is refused (``partner_called``). Supported where stock's adapter is a block
chain (Wan text-to-video, or a ``raw_vision_callback``); Cosmos 3's decoder-stack boundary and blocks that return text
states keep the unit route.
"""

from __future__ import annotations

import contextlib

import jax.numpy as jnp
import numpy as np

from ....interop.backend import to_jax_array, wrap
from ... import diffusers_private
from .base import NotInProgram, StepCache


class Magnitude(StepCache):
    """MagCache (``MagCacheConfig``), its schedule decided on the host."""

    head_name, block_name = "mag_cache_leader_block_hook", "mag_cache_block_hook"

    @property
    def calibrating(self) -> bool:
        return self.head.config.calibrate

    def current_context(self) -> str:
        if diffusers_private.context_name(self.manager) is None:  # as stock's head hook does
            diffusers_private.set_cache_context(self.manager, "inference")
        return diffusers_private.context_name(self.manager)

    def _plan(self):
        self.compute = tuple(self._decide(state) for state in self.states)
        calibrate = self.calibrating
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
                    if self.calibrating and self.previous[index] is not None:
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
                if self.calibrating:  # stock's first step logs 1.0: nothing to compare with
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


class SeaCache(Magnitude):
    """SeaCache's leader and block hooks on one block list, decided on the host before each call."""

    head_name, block_name = "sea_cache_leader_block", "sea_cache_block"
    root_names = frozenset({"sea_cache_root"})  # its gate reads the partner's step and sigma (``partner_called``)

    @classmethod
    def accepts(cls, head) -> bool:
        returns_text = diffusers_private.block_metadata(head).return_encoder_hidden_states_index is not None
        return not head.post_norm_boundary and not returns_text

    calibrating = False

    def current_context(self) -> str:
        name = diffusers_private.context_name(self.manager)
        if name is None:  # stock runs every block without a cache context; the unit route does as stock
            raise NotInProgram("SeaCache needs a cache context for each transformer call")
        return name

    def _plan(self):
        """``SeaCacheLeaderBlockHook.new_forward``'s decision per context, on stock's state, with stock's gate."""
        config, meta = self.head.config, diffusers_private.sea_cache_metadata(self.head)
        self.coordinates = diffusers_private.context_coordinates(self.manager)  # the partner's, when paired
        compute, self.extrapolate, self.inputs = [], [], []
        for state in self.states:
            state.reset_forward()
            state.full_execution_pending = True
            skip = meta is not None and self._gate(state, meta) and bool(state.history)
            compute.append(not skip)
            if not skip:
                self.extrapolate.append(None)
                continue
            history = state.history[-(config.residual_order + 1) :]
            latest_step, _, latest = history[-1]
            scale = None
            if config.residual_order == 1 and len(history) >= 2 and history[-2][0] != latest_step:
                scale = (meta.step_index - latest_step) / (latest_step - history[-2][0])
            self.extrapolate.append(scale is not None)
            self.inputs.append(to_jax_array(latest))
            if scale is not None:
                self.inputs += [to_jax_array(history[-2][2]), jnp.asarray(np.float32(scale))]
            state.skip_remaining, state.full_execution_pending = True, False
            state.cached_und_output = history[-1][1]
            state.consecutive_cached += 1
        self.compute, self.reads = tuple(compute), tuple(not c for c in compute)
        self.key = ("sea", len(self.contexts), self.compute, tuple(self.extrapolate), self.shapes())

    def partner_called(self) -> None:
        """The "uncond" call answered from the pair: its gate was decided with the "cond" call's step and sigma (its
        rows, the latents, were checked equal by the pairing); a loop that gives its context others is refused —
        stock would have gated it on its own."""
        found = diffusers_private.context_coordinates(self.manager)
        if len(self.contexts) > 1 and found != self.coordinates:
            raise RuntimeError(
                f"SeaCache: the {self.contexts[1]!r} call's cache context carries (step_index, sigma, "
                f"num_inference_steps) = {found}, the {self.contexts[0]!r} call's {self.coordinates}, whose batch "
                "decided both; pass both contexts the same, or keep the pair as two calls: "
                "pipe.to('tpu', config=TPUConfig(batch_cfg=False))."
            )

    def _gate(self, state, meta) -> bool:
        """Whether the call may skip: stock's indicator and gate (its accumulators advance on ``state``)."""
        state.step_index, state.cacheable_execution = meta.step_index, True
        shared = self.head.shared_state
        try:
            indicator = diffusers_private.sea_cache_indicator(self.head, meta)
        except (TypeError, ValueError, RuntimeError) as error:
            shared.mark_fail_open(
                f"SeaCache could not construct its vision indicator; running in fail-open mode: {error}"
            )
            indicator = None
        if indicator is None:
            shared.mark_fail_open("SeaCache could not construct its vision indicator; running in fail-open mode.")
        compute = shared.resolve_gate(state, meta, indicator, self.head.config)
        if not compute and not state.history:
            state.accumulated_distance = 0.0
            shared.mark_fail_open("SeaCache selected a cache hit without residual history; running in fail-open mode.")
        return not compute

    @contextlib.contextmanager
    def bound(self, arrays):
        """Each skipping context's residual: the latest kept, or extrapolated from the last two over the steps."""
        values, self.previous = iter(arrays), []
        for extrapolate in self.extrapolate:
            if extrapolate is None:
                self.previous.append(None)
                continue
            latest = next(values)
            if extrapolate:
                earlier, scale = next(values), next(values)
                latest = latest + (latest - earlier) * scale.astype(latest.dtype)
            self.previous.append(latest)
        yield

    def _skipped(self, hidden, index):
        residual = self.previous[index]
        if residual.shape != hidden.shape:  # stock resets its history and runs full: the unit route does as stock
            raise NotInProgram("SeaCache's kept residual no longer has the blocks' shape")
        return hidden + residual

    def commit(self, arrays) -> list:
        """``_record_full_execution`` for the computing contexts: the residual kept (the last one or two)."""
        values, passes, keep = iter(arrays), [], self.head.config.residual_order + 1
        for state, compute in zip(self.states, self.compute):
            if compute:
                residual = next(values)
                state.consecutive_cached = 0
                if state.cacheable_execution and state.step_index is not None:
                    state.history = [*state.history, (state.step_index, None, residual)][-keep:]
                state.reset_forward()
            passes.append((compute, len(self.blocks), 0))
        return passes
