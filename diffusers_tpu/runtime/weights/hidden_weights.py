"""Modules that show other parameters between calls than the runtime computes with (``sequential_offload``: stock's
``meta`` tensors; ``group_offload``: the host tensors they had), the runtime's own given back for each call
(``PipelineRuntime.weights_shown``)."""

from __future__ import annotations

import contextlib

import torch


class HiddenWeights:
    """The parameters of a pipeline's offloaded components, held while their modules show others (``meta`` tensors,
    or host ones); ``shown()`` puts them back for a call (nested calls share one showing)."""

    def __init__(self):
        self._held: dict[int, tuple[torch.nn.Module, list]] = {}
        self._depth = 0

    def hide(self, module: torch.nn.Module, shown: dict | None = None) -> None:
        """Hold ``module``'s parameters and give it others of the same shapes: ``shown[(id(owner), name)]`` (group
        offloading: the host tensors it had before the move), else ``meta`` ones (tied ones stay tied)."""
        entries, metas = [], {}
        for owner in module.modules():
            for name, tensor in owner._parameters.items():
                if tensor is None:
                    continue
                entries.append((owner, name, tensor))
                if shown is not None and (id(owner), name) in shown:
                    metas[id(tensor)] = shown[(id(owner), name)]
                elif id(tensor) not in metas:
                    meta = torch.empty(tuple(tensor.shape), dtype=tensor.dtype, device="meta")
                    metas[id(tensor)] = torch.nn.Parameter(meta, requires_grad=False)
        self._held[id(module)] = (module, entries, metas)
        if not self._depth:
            self._put(module, hidden=True)

    def release(self, module: torch.nn.Module) -> None:
        """Give ``module`` its parameters back for good (its hook is taken off)."""
        if id(module) in self._held:
            self._put(module, hidden=False)
            del self._held[id(module)]

    def holds(self, module: torch.nn.Module) -> bool:
        return id(module) in self._held

    def _put(self, module: torch.nn.Module, hidden: bool) -> None:
        _, entries, metas = self._held[id(module)]
        for owner, name, tensor in entries:
            owner._parameters[name] = metas[id(tensor)] if hidden else tensor

    @contextlib.contextmanager
    def shown(self):
        if not self._depth:
            for module, _, _ in self._held.values():
                self._put(module, hidden=False)
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
            if not self._depth:
                for module, _, _ in self._held.values():
                    self._put(module, hidden=True)
