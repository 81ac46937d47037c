"""Which of a denoiser's blocks are interchangeable: a block's ``signature`` (class, weights' shapes and dtypes, plain
attributes by value, hooks and a replaced ``forward`` by identity) and the block lists a forward calls in a loop
(``block_lists``). Two blocks scan as one loop (``repeated_blocks``) only when their signatures are equal."""

from __future__ import annotations

import types

import torch

from .. import diffusers_private

MIN_SCANNED = 2  # blocks 1..N-1 in one loop only when that is at least this many
_IGNORED = {
    "_parameters",
    "_buffers",
    "_modules",
    "forward",
    "_state_dict_hooks",
    "_state_dict_pre_hooks",
    "_load_state_dict_pre_hooks",
    "_load_state_dict_post_hooks",
    "_backward_hooks",
    "_backward_pre_hooks",
    "_is_full_backward_hook",
}
_HOOKS = ("_forward_hooks", "_forward_pre_hooks", "_forward_hooks_with_kwargs", "_forward_pre_hooks_with_kwargs")
_PLAIN = (type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device)


def _value_key(value, depth: int = 0):
    """What an attribute contributes to a block's signature: plain values by value, objects by type and contents,
    anything else (a tensor attribute, an unknown object) by identity — two blocks then differ."""
    if isinstance(value, _PLAIN):
        return (type(value).__name__, repr(value))
    if isinstance(value, (tuple, list)):
        return (type(value).__name__, tuple(_value_key(v, depth + 1) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple((repr(k), _value_key(v, depth + 1)) for k, v in value.items()))
    if isinstance(value, (set, frozenset)):
        return ("set", tuple(sorted(repr(v) for v in value)))
    if isinstance(value, types.MethodType):  # a bound method: the function and its owner's type
        return ("method", value.__func__, type(value.__self__))
    if isinstance(value, (torch.Tensor, torch.nn.Module, types.FunctionType, type)) or depth > 3:
        return ("id", id(value))
    if hasattr(value, "__dict__"):  # an attention processor (callable), a config object
        return ("object", type(value), tuple((k, _value_key(v, depth + 1)) for k, v in sorted(vars(value).items())))
    return ("id", id(value))


def traced_dict(value) -> bool:
    """A dict of tensors kept as a module attribute (peft's ``scaling`` while ``lora.Scalings`` feeds it)."""
    return isinstance(value, dict) and bool(value) and all(isinstance(v, torch.Tensor) for v in value.values())


def signature(block: torch.nn.Module):
    """A block's structure, weights' shapes and Python attributes; None when it carries hooks or its own forward."""
    parts = []
    for name, module in block.named_modules(remove_duplicate=False):
        if diffusers_private.hook_names(module):
            return None  # diffusers hooks decide per call in Python (the denoiser runs units then anyway)
        own_forward = vars(module).get("forward")
        same_everywhere = getattr(own_forward, "_diffusers_tpu_unit", False) or getattr(
            own_forward,
            "_diffusers_tpu_same_in_every_block",
            False,  # a step cache's part (``step_caches``)
        )
        if own_forward is not None and not same_everywhere:
            return None  # a forward set on this one instance: blocks may not be interchangeable
        attributes = []
        for key, value in sorted(vars(module).items()):
            if key in _IGNORED or (key == "kwargs" and hasattr(module, "lora_A")):
                continue  # peft keeps its creation arguments (the layer's own name) there; forward never reads them
            if key in _HOOKS:  # compared by what they are (sharding.ActivationConstraint), not by handle id
                value = tuple(value.values())
            if traced_dict(value):
                value = tuple(value)  # traced values (LoRA scales, ``lora.Scalings``): picked per layer like weights
            attributes.append((key, _value_key(value)))
        tensors = [(n, tuple(t.shape), t.dtype) for n, t in module.named_parameters(recurse=False)]
        tensors += [(n, tuple(t.shape), t.dtype) for n, t in module.named_buffers(recurse=False)]
        parts.append((name, type(module), tuple(attributes), tuple(tensors)))
    return tuple(parts)


def block_lists(root: torch.nn.Module, always: tuple = ()) -> list[tuple[str, list]]:
    """``(path, blocks)`` of every ModuleList under ``root`` of at least ``MIN_SCANNED + 1`` interchangeable blocks
    (not inside another such list); of two or more for the paths in ``always`` (a step cache's list)."""
    found, inside = [], []
    for path, module in root.named_modules():
        if not isinstance(module, torch.nn.ModuleList) or len(module) <= (MIN_SCANNED if path not in always else 1):
            continue
        if any(path.startswith(f"{outer}.") for outer in inside):
            continue
        blocks = list(module)
        first = signature(blocks[0])
        if first is not None and all(signature(b) == first for b in blocks[1:]):
            found.append((path, blocks))
            inside.append(path)
    return found


# -- one traced forward --------------------------------------------------------------------------------------
