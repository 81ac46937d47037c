"""Stock code run with plain torch on the host while the pipeline is on JAX: text encoders placed on the host,
pipeline methods that build small tensors from sizes (``encode_prompt``'s glue, RoPE tables), and ``state_dict`` of
placed modules (gathered, so ``save_pretrained`` works)."""

from __future__ import annotations

import inspect

import torch

from ...interop import backend, sharding, user_tensors
from ...interop.torch_private import pytree
from ..weights import quantize
from .hook_chain import Hook


def host_state_dict(state_dict, module):
    """``state_dict()`` of a placed module as host tensors (gathered), so ``save_pretrained`` works on JAX; quantized
    weights as stock holds them, never their int8 values."""

    def gathered(*args, **kwargs):
        result = state_dict(*args, **kwargs)
        prefix = kwargs.get("prefix", args[1] if len(args) > 1 else "")
        quantized = {prefix + s.qualified: s for s in sharding.slots_of(module) if s.scale is not None}
        for key, value in result.items():
            result[key] = quantize.host_weight(quantized[key]) if key in quantized else user_tensors.to_cpu(value)
        return result

    gathered.__wrapped__ = state_dict
    return gathered


def parameters(method) -> tuple[str, ...]:
    return tuple(inspect.signature(method).parameters) if callable(method) else ()


# Stock pipeline helpers that build tensors from sizes alone (CogVideoX's 3-D RoPE tables: ~100 one-off device
# programs of iota/cumsum/outer products on a first call), run on the host like ``encode_prompt``.
HOST_HELPERS = ("_prepare_rotary_positional_embeddings",)


class OnHost(Hook):
    """The ``on_host`` hook of a stock pipeline method with a ``device`` parameter: it runs on the host
    (``device="cpu"``, plain torch) as a whole, its tensor results moved to the devices in one transfer at the end. For
    ``encode_prompt`` with host text encoders, the glue around the encoders (each prompt trimmed to its length and
    padded again, repeats, casts) then runs where their outputs are, as stock does, instead of as a dozen one-off
    device programs per prompt length."""

    name = "on_host"

    def __init__(self, method, runtime):
        self.signature, self.runtime = inspect.signature(method), runtime

    def pre_call(self, call) -> None:
        bound = self.signature.bind(*call.args, **call.kwargs)
        bound.arguments["device"] = torch.device("cpu")
        self.runtime.encoding_on_host += 1
        call.stack.callback(self._done)
        call.stack.enter_context(backend.torch_mode())
        call.args = [_on_host(value) for value in bound.args]
        call.kwargs = {name: _on_host(value) for name, value in bound.kwargs.items()}

    def _done(self) -> None:
        self.runtime.encoding_on_host -= 1

    def post_call(self, call, output):
        return user_tensors.to_device(output) if self.runtime.inside_call() else output


def _on_host(value):
    """``value`` with its tensors on the host; plain values (strings, numbers, lists of them) are passed as they are,
    the caller's own objects: stock code writes into them (Z-Image's ``encode_prompt`` puts its chat template into
    the caller's prompt list, and the next call with that list encodes those strings)."""
    if all(isinstance(leaf, (str, int, float, type(None))) for leaf in pytree.tree_leaves(value)):
        return value
    return pytree.tree_map(user_tensors.to_cpu, value)


class OnHostModule(Hook):
    """The ``on_host`` hook of a host text encoder's ``forward``: plain torch on the host, whatever device its inputs
    sit on. Inside a pipeline call its outputs go to the devices, as a GPU text encoder's outputs are on the GPU
    (pipeline code mixes them with device tensors, e.g. Qwen-Image's masked selection), unless an ``OnHost`` method
    is running it (its glue wants them on the host); called by the user, it returns host tensors."""

    name = "on_host"

    def __init__(self, runtime):
        self.runtime = runtime

    def pre_call(self, call) -> None:
        call.stack.enter_context(backend.torch_mode())
        call.args, call.kwargs = pytree.tree_map(user_tensors.to_cpu, (call.args, call.kwargs))

    def post_call(self, call, output):
        placed = self.runtime.inside_call() and not self.runtime.encoding_on_host
        return user_tensors.to_device(output) if placed else output
