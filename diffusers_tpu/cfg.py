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

import jax.numpy as jnp
import torch

from .backend import is_jax_tensor, to_jax_array, wrap

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class _Pending:
    module: torch.nn.Module
    others: dict
    negative: torch.Tensor
    uncond: object


class CFGPairing:
    def __init__(self, condition_arg: str, batched_args: tuple[str, ...]):
        self.condition_arg = condition_arg
        self.batched_args = batched_args
        self.negative = None  # what encode_prompt returned for the negative prompt
        self.accepted = None  # the negative tensor object the loop actually passes (learned at step 0)
        self.pending: _Pending | None = None
        self.context: dict[int, str | None] = {}
        self.batched_steps = 0

    def reset(self) -> None:
        self.negative = self.accepted = self.pending = None
        self.batched_steps = 0

    # -- seams ------------------------------------------------------------------------------------------
    def capture_negative(self, encode_prompt, pick):
        def encode(*args, **kwargs):
            out = encode_prompt(*args, **kwargs)
            self.negative, self.accepted = pick(out), None
            return out

        encode.__wrapped__ = encode_prompt
        return encode

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

    def wrap_denoiser(self, module, forward, hooked=lambda: False):
        """``hooked()``: diffusers hooks (a step cache) keep per-context state, so those calls stay separate."""

        def paired(*args, **kwargs):
            name = self.context.get(id(module)) or self._role(kwargs.get(self.condition_arg))
            if args or name not in ("cond", "uncond") or self.condition_arg not in kwargs or hooked():
                self.pending = None
                return forward(*args, **kwargs)
            if name == "cond":
                return self._cond(module, forward, kwargs)
            return self._uncond(module, forward, kwargs)

        paired.__wrapped__ = forward
        return paired

    # -- the pairing --------------------------------------------------------------------------------------
    def _role(self, condition):
        """A loop without cache contexts (Wan video-to-video): the call with the negative embeddings is "uncond",
        any other one while a negative prompt exists is "cond" (its batched uncond half is only used if the next
        call's inputs match exactly)."""
        if self.negative is None or not is_jax_tensor(condition):
            return None
        if condition is self.negative or condition is self.accepted or (
                self.pending is not None and condition is self.pending.negative):
            return "uncond"
        if self.pending is not None and _equal(condition, self.pending.negative):
            return "uncond"
        return "cond"

    def _negative_for(self, condition):
        candidate = self.accepted if self.accepted is not None else self.negative
        if not (is_jax_tensor(candidate) and is_jax_tensor(condition)) or candidate.shape != condition.shape:
            return None
        if candidate.dtype != condition.dtype:  # the loop casts embeddings to the denoiser dtype
            candidate = wrap(to_jax_array(candidate).astype(to_jax_array(condition).dtype))
        return candidate

    def _cond(self, module, forward, kwargs):
        self.pending = None
        condition = kwargs[self.condition_arg]
        negative = self._negative_for(condition)
        if negative is None:
            return forward(**kwargs)
        batch = condition.shape[0]
        batched = dict(kwargs)
        for name in self.batched_args:
            value = kwargs.get(name)
            if is_jax_tensor(value) and value.ndim and value.shape[0] == batch:
                batched[name] = wrap(jnp.concatenate([to_jax_array(value)] * 2))
            elif isinstance(value, list) and len(value) == batch:  # per-sample Python values (SkyReels' fps)
                batched[name] = value * 2
        batched[self.condition_arg] = wrap(jnp.concatenate([to_jax_array(condition), to_jax_array(negative)]))
        out = forward(**batched)
        cond, uncond = _split(out, batch)
        others = {k: v for k, v in kwargs.items() if k != self.condition_arg}
        self.pending = _Pending(module, others, negative, uncond)
        self.batched_steps += 1
        return cond

    def _uncond(self, module, forward, kwargs):
        pending, self.pending = self.pending, None
        negative = kwargs[self.condition_arg]
        if pending is not None and pending.module is module and _same(pending.others, kwargs, self.condition_arg):
            if negative is pending.negative or negative is self.accepted:
                return pending.uncond
            if self.accepted is None and _equal(negative, pending.negative):
                self.accepted = negative  # later steps match by identity: no device sync
                return pending.uncond
        if pending is not None:
            logger.info("CFG pairing skipped: the unconditional call's inputs differ from the batched ones.")
        return forward(**kwargs)


def _split(out, batch):
    import torch.utils._pytree as pytree

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


def _same(previous: dict, current: dict, skip: str) -> bool:
    if set(previous) != {k for k in current if k != skip}:
        return False
    for key, value in previous.items():
        other = current[key]
        if isinstance(value, torch.Tensor) or isinstance(other, torch.Tensor):
            if value is not other:
                return False
        elif value != other:
            return False
    return True


def _equal(a, b) -> bool:
    if not (is_jax_tensor(a) and is_jax_tensor(b)) or a.shape != b.shape or a.dtype != b.dtype:
        return False
    return bool(jnp.array_equal(to_jax_array(a), to_jax_array(b)))
