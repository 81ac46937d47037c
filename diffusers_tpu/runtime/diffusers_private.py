"""Every private name of diffusers the project uses, behind one door: each entry says why no public API serves and was
checked on diffusers 0.38.0 and 0.42.1 (``CHECKED_ON``); ``tests/runtime/test_diffusers_private.py`` fails when a
release changes one. Where diffusers has a public way it is used instead (``attention_backend``)."""

from __future__ import annotations

import sys

import diffusers
import torch
from diffusers.models import attention_dispatch

CHECKED_ON = ("0.38.0", "0.42.1")
NATIVE = attention_dispatch.AttentionBackendName.NATIVE


def hook_registry(module):
    """The ``HookRegistry`` diffusers keeps on ``module`` (its ``_diffusers_hook`` attribute), or None. Why private:
    the public ``HookRegistry.check_if_exists_or_initialize`` creates one where there is none; reading must not."""
    return getattr(module, "_diffusers_hook", None)


def hook_names(module) -> list[str]:
    """The names of the hooks registered on ``module`` itself, outermost last (none: [])."""
    registry = hook_registry(module)
    return list(registry.hooks) if registry is not None else []


def innermost_forward_reference(module):
    """Where a hook chain on ``module`` keeps the module's own forward: (function reference object, attribute name), or
    None without hooks. Why private: ``HookRegistry._fn_refs[0]`` is the only handle on the end of the chain; the
    runtime installs the compiled denoiser there, so the hooks run around it (``runtime.denoiser``)."""
    registry = hook_registry(module)
    if registry is None or not registry.hooks:
        return None
    reference = registry._fn_refs[0]
    return reference, "original_forward" if reference.original_forward is not None else "forward"


def active_attention_backend() -> attention_dispatch.AttentionBackendName:
    """The backend diffusers' attention dispatch uses for processors that name none (set by
    ``diffusers.attention_backend(...)`` or ``DIFFUSERS_ATTN_BACKEND``). Why private:
    ``_AttentionBackendRegistry.get_active_backend`` is the only reader."""
    return attention_dispatch._AttentionBackendRegistry.get_active_backend()[0]


def make_active(backend: attention_dispatch.AttentionBackendName) -> None:
    """Make ``backend`` the process's active one again (``ModelMixin.set_attention_backend`` also makes the backend it
    names active for every processor). Why private: the public ``attention_backend(...)`` context restores on exit only;
    there is no public setter."""
    attention_dispatch._AttentionBackendRegistry.set_active_backend(backend)


def native_attention():
    """The public ``diffusers.attention_backend("native")`` context."""
    return diffusers.attention_backend(NATIVE)


def processor_backend(processor):
    """The backend a processor names (``set_attention_backend`` sets it; None: the active one). Why private:
    ``processor._attention_backend`` has no public reader, and a user's choice must come back on ``pipe.to("cpu")``."""
    return getattr(processor, "_attention_backend", None)


def name_processor_backend(processor, backend) -> None:
    """Name ``backend`` on one processor (``set_attention_backend`` names one for all of a model's). Why private: no
    public way sets a single processor's, and a user's per-processor choices must come back exactly."""
    processor._attention_backend = backend


def serve_backend(name: attention_dispatch.AttentionBackendName, function):
    """diffusers' dispatch serves backend ``name`` with ``function(stock)`` from now on; returns the undo. Why private:
    the registry has no public way to replace a registered backend's function (``_AttentionBackendRegistry._backends``);
    the ``flex`` backend's torch function cannot run on JAX (``runtime.attention.flex_attention``)."""
    backends = attention_dispatch._AttentionBackendRegistry._backends
    stock = backends.get(name)
    served = backends[name] = function(stock)

    def undo():
        if backends.get(name) is served:
            backends[name] = stock

    return undo


def cache_state(manager, name: str):
    """The state a step cache's ``StateManager`` keeps for cache context ``name`` (made as stock makes it, at first
    use), the manager's current context left as it was. Why private: ``StateManager.get_state`` reads only the current
    context, and the manager's private current context is the only way to put it back (it may be None)."""
    current = _raw_context(manager)
    set_cache_context(manager, name)
    try:
        return manager.get_state()
    finally:
        manager.set_context(current)


def set_cache_context(manager, name: str) -> None:
    """Make ``name`` the manager's current cache context, as a pipeline's ``cache_context(name)`` does: a
    ``CacheContext`` since diffusers 0.39, the name itself before."""
    # read from the module that defined the manager (importing ``diffusers.hooks`` here would import peft early)
    context = getattr(sys.modules[type(manager).__module__], "CacheContext", None)
    manager.set_context(context(name=name) if context is not None else name)


def context_name(manager) -> str | None:
    """The cache context a step cache's ``StateManager`` is in now (the pipeline's ``cache_context(...)``), or None.
    Why private: the public ``context`` property (0.39+) raises when there is none; 0.38 has no public reader."""
    current = _raw_context(manager)
    return getattr(current, "name", current)


def context_coordinates(manager) -> tuple:
    """(step index, sigma, step count) the cache context a step cache's ``StateManager`` is in now carries (what
    SeaCache's root hook reads), tensors as numbers. Why private: the same reader as ``context_name``."""
    current = _raw_context(manager)
    values = (getattr(current, name, None) for name in ("step_index", "sigma", "num_inference_steps"))
    return tuple(value.item() if isinstance(value, torch.Tensor) else value for value in values)


def reset_cache_hooks(module) -> None:
    """Every stateful hook of ``module``'s step cache back to its start, as stock pipelines do at a call's end. Why
    private: ``CacheMixin._reset_stateful_cache`` is what ``maybe_free_model_hooks`` calls; the public way
    (``diffusers.hooks.HookRegistry``) imports PEFT, which ``import diffusers_tpu`` does not."""
    module._reset_stateful_cache()


def _raw_context(manager):
    return vars(manager).get("_context", vars(manager).get("_current_context"))  # 0.39+ / 0.38


def block_metadata(hook):
    """What a cache hook knows of its block's call (``TransformerBlockMetadata``: which output is the hidden states,
    which the text states, where ``hidden_states`` is among the arguments). Why private: the hook's ``_metadata`` is
    the registry entry it was initialized with; ``TransformerBlockRegistry`` lives in the private ``hooks._helpers``."""
    return hook._metadata


def block_argument(metadata, name: str, args, kwargs):
    """Argument ``name`` of a block call, found as stock's cache hooks find it (by keyword, else by position).
    Why private: ``TransformerBlockMetadata._get_parameter_from_args_kwargs`` is stock's only reader."""
    return metadata._get_parameter_from_args_kwargs(name, args, kwargs)


def advance_mag_cache_step(tail_hook, state) -> None:
    """MagCache's end of one pass on ``state`` (its step counter, and the reset after the schedule's last step).
    Why private: ``MagCacheBlockHook._advance_step`` is stock's only code for it; calling it keeps the schedule the
    same as stock's by construction."""
    tail_hook._advance_step(state)


def sea_cache_indicator(leader_hook, forward_metadata):
    """SeaCache's indicator of this call's input latents (their spectrum filtered at the call's sigma), as stock's
    leader hook builds it. Why private: ``SeaCacheLeaderBlockHook._build_indicator`` is stock's only code for it."""
    return leader_hook._build_indicator(forward_metadata)


def sea_cache_metadata(leader_hook):
    """The step index, sigma, step count and input latents SeaCache's root hook read for the running call (None
    where it runs fail-open). Why private: ``SeaCacheSharedState.forward_metadata`` is set by the root hook only."""
    return leader_hook.shared_state.forward_metadata


class _OnePrompt:
    """What a TextKVCache block hook reads of its two state managers, for one prompt: its key and, when given, the
    keys and values kept for it (else it computes them and puts them here)."""

    _context = _current_context = "one prompt"  # diffusers 0.39+ / 0.38
    key = 0

    def __init__(self, kept):
        self.kv_cache = {} if kept is None else {self.key: kept}

    def get_state(self):
        return self


def text_kv_block_call(hook, module, kept, args, kwargs):
    """A TextKVCache block hook's own call (``TextKVCacheBlockHook.new_forward``: the text keys and values it
    computes, or ``kept``, handed to the block's attention) for one prompt: ``(output, (keys, values))``. Why
    private: the hook reads its managers' private ``_context``; stand-in managers are the only way to give it values
    that are not its state's (a traced program's)."""
    stand_in, managers = _OnePrompt(kept), (hook.state_manager, hook.block_state_manager)
    hook.state_manager = hook.block_state_manager = stand_in
    try:
        out = hook.new_forward(module, *args, **kwargs)
    finally:
        hook.state_manager, hook.block_state_manager = managers
    return out, stand_in.kv_cache[stand_in.key]
