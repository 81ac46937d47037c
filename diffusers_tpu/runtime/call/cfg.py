"""Classifier-free guidance as ONE batch, without copying any pipeline's ``__call__``.

Stock loops (Wan) call the denoiser twice per step, inside ``cache_context("cond")`` and then
``cache_context("uncond")``, with the same latents and timestep. Their negative embeddings come from
``encode_prompt`` before the loop. So on the "cond" call this wrapper runs ``[cond; uncond]`` as one batch
(sharded over dp, each half on its own devices), returns the cond half and keeps the uncond half; the
"uncond" call that follows gets it if — and only if — its inputs are the ones that were batched (same latents
and timestep objects, same negative embeddings). Anything else (a callback that swapped embeddings, a
different loop) simply runs the call normally, so the pairing can never change a result.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import weakref

import jax.numpy as jnp
import torch

from ...interop.backend import host_to_jax, is_jax_tensor, to_jax_array, wrap
from ...interop.torch_private import pytree
from . import step_caches
from .denoiser_hooks import HookRoute
from .hook_chain import Call, Hook

logger = logging.getLogger(__name__)


# cache-context names of the two passes: the pipelines' own loops, and diffusers guiders' ("pred_cond" / "pred_uncond")
_ROLES = {"cond": "cond", "uncond": "uncond", "pred_cond": "cond", "pred_uncond": "uncond"}
_PARTNER = {"cond": "uncond", "pred_cond": "pred_uncond"}  # the cache context the uncond rows' state is kept under


@dataclasses.dataclass
class _UncondComputedAhead:
    """The uncond pass computed in the cond call's batch, returned by the loop's own uncond call if it matches."""

    module: torch.nn.Module
    others: dict
    negative: tuple
    uncond: object


class CFGPairing:
    """The guidance pair of one runtime batched as its family says (``registry.CFGBatching``: the denoiser keywords
    that differ between the "cond" and "uncond" calls — one for Wan, embeddings + mask + pooled projections for
    HunyuanVideo — and how the negative value(s) are picked from ``encode_prompt``, in that order)."""

    def __init__(self, spec, guided=lambda: True):
        self.spec = spec
        # whether the step about to run has an unconditional pass (a diffusers guider enabled for part of the
        # schedule: outside it the "cond" call is the step's only one, and runs alone, not as the pair)
        self.guided = guided
        self.negative_call = spec.negative_call  # which encode_prompt call of a pipeline call gives the negative
        # the text lengths of cond and uncond may differ (each padded to its own longest prompt): pad both to the
        # longer one with masked (zero) tokens, exact where the model masks padded keys (Qwen-Image's key mask)
        self.pad_text = spec.pad_text
        self.encodes = 0
        condition_args = spec.condition_args
        self.condition_args = (condition_args,) if isinstance(condition_args, str) else tuple(condition_args)
        self.batched_args = spec.batched_args
        self.grouped_args = spec.grouped_args
        self.negative = None  # what encode_prompt returned for the negative prompt (a tuple)
        self.accepted = None  # the negative tensor objects the loop actually passes (learned at step 0)
        self.pending: _UncondComputedAhead | None = None
        self.context: dict[int, str | None] = {}
        self.batched_steps = 0
        self._moved: dict[int, tuple] = {}  # id -> (weakref to the host tensor, its device copy)
        self._joins: dict[str, tuple] = {}  # condition keyword -> (cond, uncond, length, lengths, the batch's array)

    def reset(self) -> None:
        self._moved.clear()
        self._joins.clear()
        self.negative = self.accepted = self.pending = None
        self.batched_steps = self.encodes = 0

    # -- seams ------------------------------------------------------------------------------------------
    def negative_hook(self) -> Hook:
        """The ``cfg_pairing`` hook of ``encode_prompt``: keeps what it returns for the negative prompt."""
        return _CaptureNegative(self)

    def track_context(self, module, cache_context):
        @contextlib.contextmanager
        def tracked(name, **kwargs):
            previous = self.context.get(id(module))
            self.context[id(module)] = name
            try:
                with cache_context(name, **kwargs):
                    yield
            finally:
                self.context[id(module)] = previous

        tracked.__wrapped__ = cache_context
        return tracked

    def denoiser_hook(self, module, hook_route=lambda: HookRoute.NONE, answered=lambda: None) -> Hook:
        """The ``cfg_pairing`` hook of ``module.forward``. ``hook_route()`` (``Denoiser.hook_route``): how diffusers
        hooks keep per-context state (under ``PROGRAM`` each half's rows keep their context's state; ``INPUTS`` is
        TextKVCache's); ``answered()`` (``Denoiser.pair_answered``): an "uncond" call got its half of the batch."""
        return _PairedCalls(self, module, hook_route, answered)

    # -- the pairing --------------------------------------------------------------------------------------
    def conditions_of(self, kwargs):
        """The call's condition values; a padded-text family's mask may be None (stock drops an all-ones one)."""
        values = tuple(kwargs.get(name) for name in self.condition_args)
        if not isinstance(values[0], torch.Tensor) or not all(
            isinstance(v, torch.Tensor) or self.pad_text and v is None for v in values[1:]
        ):
            return None
        return tuple(v if v is None or is_jax_tensor(v) else self.on_device(v) for v in values)

    def on_device(self, tensor):
        """A condition the pipeline left on the host (HunyuanVideo's pooled CLIP embeddings), moved once per object
        so identity checks keep working from step to step."""
        source, moved = self._moved.get(id(tensor), (None, None))
        if source is None or source() is not tensor:
            moved = wrap(host_to_jax(tensor))
            self._moved[id(tensor)] = (weakref.ref(tensor), moved)
        return moved

    def role(self, conditions):
        """A loop without cache contexts (Wan video-to-video): the call with the negative embeddings is "uncond",
        any other one while a negative prompt exists is "cond" (its batched uncond half is only used if the next
        call's inputs match exactly)."""
        if self.negative is None or conditions is None:
            return None
        known = [self.negative, self.accepted, self.pending.negative if self.pending is not None else None]
        if any(k is not None and all(a is b for a, b in zip(conditions, k)) for k in known):
            return "uncond"
        if self.pending is not None and all(_equal(a, b) for a, b in zip(conditions, self.pending.negative)):
            return "uncond"
        return "cond"

    def _negatives_for(self, conditions):
        candidates = self.accepted if self.accepted is not None else self.negative
        if candidates is None or len(candidates) != len(conditions):
            return None
        negatives = []
        for index, (candidate, condition) in enumerate(zip(candidates, conditions)):
            if index and self.pad_text and (candidate is None or condition is None):  # an all-ones mask, dropped
                if candidate is not None and not is_jax_tensor(candidate):
                    return None
                negatives.append(candidate)
                continue
            if not is_jax_tensor(candidate) or candidate.ndim != condition.ndim:
                return None
            if candidate.shape != condition.shape and not (
                self.pad_text
                and candidate.ndim >= 2
                and candidate.shape[0] == condition.shape[0]
                and candidate.shape[2:] == condition.shape[2:]
            ):
                return None
            if candidate.dtype != condition.dtype:  # the loop casts embeddings to the denoiser dtype
                candidate = wrap(to_jax_array(candidate).astype(to_jax_array(condition).dtype))
            negatives.append(candidate)
        return tuple(negatives)

    def batched(self, kwargs, conditions):
        """The "cond" call's keywords with the pair batched ([cond; uncond]), and its negatives; None when the negative
        embeddings are unknown or unlike the call's (the call then runs as it is)."""
        self.pending = None
        negatives = self._negatives_for(conditions)
        if negatives is None:
            return None
        batch = conditions[0].shape[0]
        batched = dict(kwargs)
        for name in self.batched_args:
            value = kwargs.get(name)
            rows = value.shape[0] if is_jax_tensor(value) and value.ndim else None
            if rows is not None and (rows == batch or name in self.grouped_args and rows % batch == 0):
                batched[name] = wrap(jnp.concatenate([to_jax_array(value)] * 2))
            elif isinstance(value, list) and len(value) == batch:  # per-sample Python values (SkyReels' fps)
                batched[name] = value * 2
        texts = (conditions[0].shape[:2], negatives[0].shape[:2])  # each half's [rows, text length]
        length = max(texts[0][1], texts[1][1]) if self.pad_text else None
        for name, condition, negative in zip(self.condition_args, conditions, negatives):
            if condition is None and negative is None and texts[0] == texts[1]:
                continue  # no mask, none needed: the call's None stays
            arrays = [None if x is None else to_jax_array(x) for x in (condition, negative)]
            batched[name] = wrap(self._joined(name, *arrays, length, texts))
        return batched, negatives

    def _joined(self, name: str, condition, negative, length, texts):
        """``[condition; negative]`` (padded to ``length``; a mask stock dropped as all ones made again, ``texts``
        long): one array while both halves are the same, as the loop's text states are from step to step (no copy
        per step; TextKVCache's key stays the batch's)."""
        kept = self._joins.get(name)
        if kept is not None and kept[0] is condition and kept[1] is negative and kept[2:4] == (length, texts):
            return kept[4]
        dtype = next((x.dtype for x in (condition, negative) if x is not None), jnp.int32)
        pair = [jnp.ones(shape, dtype) if x is None else x for x, shape in zip((condition, negative), texts)]
        if length is not None:
            pair = [jnp.pad(x, [(0, 0), (0, length - x.shape[1])] + [(0, 0)] * (x.ndim - 2)) for x in pair]
        joined = jnp.concatenate(pair)
        self._joins[name] = (condition, negative, length, texts, joined)
        return joined

    def split(self, module, kwargs, negatives, out):
        """The batched call's output: the cond half returned, the uncond half kept for the loop's next call."""
        cond, uncond = _split(out, negatives[0].shape[0])
        others = {k: v for k, v in kwargs.items() if k not in self.condition_args}
        self.pending = _UncondComputedAhead(module, others, negatives, uncond)
        self.batched_steps += 1
        return cond

    def _same(self, previous: dict, current: dict) -> bool:
        """The other arguments of the uncond call are the batched call's: the same objects, or equal values (a
        loop that rebuilds ``timestep / 1000`` or zero text ids per call)."""
        if set(previous) != {k for k in current if k not in self.condition_args}:
            return False
        for key, value in previous.items():
            other = current[key]
            if isinstance(value, torch.Tensor) or isinstance(other, torch.Tensor):
                if value is not other and not _equal(value, other):
                    return False
            elif value != other:
                return False
        return True

    def computed_ahead(self, module, kwargs, conditions):
        """The "uncond" call: its half of the batched call when its inputs are the ones batched, else None."""
        pending, self.pending = self.pending, None
        if pending is not None and pending.module is module and self._same(pending.others, kwargs):
            if (
                all(c is n for c, n in zip(conditions, pending.negative))
                or self.accepted is not None
                and all(c is a for c, a in zip(conditions, self.accepted))
            ):
                return pending
            if self.accepted is None and all(_equal(c, n) for c, n in zip(conditions, pending.negative)):
                self.accepted = conditions  # later steps match by identity: no device sync
                return pending
        if pending is not None:
            logger.info("CFG pairing skipped: the unconditional call's inputs differ from the batched ones.")
        return None


class _PairedCalls(Hook):
    """The denoiser's ``cfg_pairing`` hook: the "cond" call runs the pair, the "uncond" call gets its half."""

    name = "cfg_pairing"

    def __init__(self, pairing: CFGPairing, module, hook_route, answered):
        self.pairing, self.module, self.hook_route, self.answered = pairing, module, hook_route, answered

    def pre_call(self, call: Call) -> None:
        pairing = self.pairing
        conditions = pairing.conditions_of(call.kwargs)
        context = pairing.context.get(id(self.module))
        name = _ROLES.get(context) or pairing.role(conditions)
        route = self.hook_route()
        if route is HookRoute.UNITS or route is HookRoute.PROGRAM and name == "cond" and context not in _PARTNER:
            pairing.pending = None  # per-context hook state: only named contexts' rows can share a call
        elif call.args or name not in ("cond", "uncond") or conditions is None:
            pairing.pending = None
        elif name == "cond" and not pairing.guided():
            pairing.pending = None  # the guider runs no unconditional pass at this step: the single program
        elif name == "cond":
            found = pairing.batched(call.kwargs, conditions)
            if found is not None:
                call.notes[self.name] = (call.kwargs, found[1])
                call.kwargs = found[0]
                if context in _PARTNER or route is HookRoute.INPUTS:
                    rows = (context, _PARTNER[context]) if context in _PARTNER else ("cond", "uncond")
                    call.stack.enter_context(step_caches.batched_rows(rows))
        else:
            ahead = pairing.computed_ahead(self.module, call.kwargs, conditions)
            if ahead is not None:
                self.answered()
                call.answer(ahead.uncond)

    def post_call(self, call: Call, output):
        if self.name not in call.notes:
            return output
        kwargs, negatives = call.notes[self.name]
        return self.pairing.split(self.module, kwargs, negatives, output)


class _CaptureNegative(Hook):
    """``encode_prompt``'s ``cfg_pairing`` hook: the output of the pipeline call's negative-prompt encoding kept."""

    name = "cfg_pairing"

    def __init__(self, pairing: CFGPairing):
        self.pairing = pairing

    def post_call(self, call: Call, output):
        pairing = self.pairing
        if pairing.encodes == pairing.negative_call:
            picked = pairing.spec.negative(output)
            picked = tuple(picked) if isinstance(picked, (tuple, list)) else (picked,)
            pairing.negative = tuple(
                p if is_jax_tensor(p) or not isinstance(p, torch.Tensor) else pairing.on_device(p) for p in picked
            )
            pairing.accepted = None
        pairing.encodes += 1
        return output


def _split(out, batch):
    leaves, spec = pytree.tree_flatten(out)
    first, second = [], []
    for leaf in leaves:
        if is_jax_tensor(leaf) and leaf.ndim and leaf.shape[0] == 2 * batch:
            array = to_jax_array(leaf)
            first.append(wrap(array[:batch]))
            second.append(wrap(array[batch:]))
        else:
            first.append(leaf)
            second.append(leaf)
    return pytree.tree_unflatten(first, spec), pytree.tree_unflatten(second, spec)


def _equal(a, b) -> bool:
    if a is None or b is None:
        return a is b
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or a.shape != b.shape or a.dtype != b.dtype:
        return False
    return bool(jnp.array_equal(to_jax_array(a), to_jax_array(b)))
