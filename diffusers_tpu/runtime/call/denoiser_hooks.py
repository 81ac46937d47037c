"""The diffusers hooks on a denoiser: which there are, which cannot run on JAX (refused with the alternative), and
whether the guidance pair may still share one call under a step cache that keeps its state per cache context."""

from __future__ import annotations

import enum

import torch

from .. import diffusers_private


class HookRoute(enum.Enum):
    """How the diffusers hooks on a denoiser run, and so whether the guidance pair may share a call."""

    NONE = "no hooks"
    PROGRAM = "a step cache in whole-step programs: the pair batched when the loop names its contexts"
    INPUTS = "a step cache whose state the call's inputs carry: the pair batched whatever its contexts"
    UNITS = "calls stay separate: block units, or a cache whose state both passes share"


# Hooks that manage weights or devices themselves: on JAX the mesh, TPUConfig dtypes and the runtime do that.
REFUSED_HOOKS = {
    "layerwise_casting": "enable_layerwise_casting (use TPUConfig(dtype=...) or torch_dtype=torch.bfloat16)",
    "peft_autocast_disable": "enable_layerwise_casting (use TPUConfig(dtype=...))",
    "group_offloading": "enable_group_offload onto a torch device (use enable_group_offload(onload_device='tpu'))",
    "layer_execution_tracker": "enable_group_offload",
    "lazy_prefetch_group_offloading": "enable_group_offload",
}


def active_hooks(root: torch.nn.Module) -> dict:
    """{module: [hook names]} for every module under ``root`` (itself included) with registered diffusers hooks."""
    found = {}
    for module in root.modules():
        registry = diffusers_private.hook_registry(module)
        names = [n for n, hook in (registry.hooks.items() if registry is not None else ()) if not _on_jax(hook)]
        if names:
            found[module] = names
    return found


def inner_hooks(hooks: dict, module) -> dict:
    """``hooks`` (``active_hooks``) below ``module``: those on the module itself run around its compiled entry."""
    return {m: names for m, names in hooks.items() if m is not module}


def batches_pair(cache, hooks: dict, module) -> bool:
    """Whether the pair may share a call under ``cache``: its state kept per context, and any hook on the denoiser
    itself one the cache plays its part around (``StepCache.root_names``)."""
    return cache is not None and cache.pairs and {n.split("---")[0] for n in hooks.get(module, ())} <= cache.root_names


def _on_jax(hook) -> bool:
    """A hook the runtime registered itself (``group_offload``'s ``OnJax``), which does nothing on JAX."""
    return getattr(hook, "on_jax", False)


def check_hooks(root: torch.nn.Module, where: str) -> None:
    """Refuse hooks that cannot work on JAX, naming the module, the call that installed them and the alternative."""
    hooks = active_hooks(root)
    names = {id(m): n for n, m in root.named_modules()} if hooks else {}
    for module, hook_names in hooks.items():
        for name in hook_names:
            base = name.split("---")[0]
            if base in REFUSED_HOOKS or base.startswith("cp_"):
                what = REFUSED_HOOKS.get(
                    base, "enable_parallelism (call it after pipe.to('tpu'), where its degrees become the mesh)"
                )
                call, _, instead = what.partition(" (")
                path = names.get(id(module)) or "(the model itself)"
                raise ValueError(
                    f"{where}: {type(root).__name__}.{path} has a '{name}' hook from {call}, which cannot run on "
                    f"JAX; {instead.rstrip(')')}. Remove it first (reload the model without it)."
                )
