"""``enable_group_offload(onload_device="tpu" | "jax")``: diffusers' group offloading, on JAX.

Stock's keeps a component's weights on the host (``offload_device``) and moves a group of its layers to the
accelerator around the group's forward. On JAX a step is one compiled program, so the grouping happens inside it: the
components are stored in host memory (``TPUConfig(weights_in_host_memory=(names...))``, ``host_memory``) and each
repeated block's layer is moved to the devices where the layer loop reads it — ``block_level`` with one block per
group, whatever ``offload_type`` and ``num_blocks_per_group`` say (they choose how stock's hooks group layers, which a
compiled program does not need; the results are the same). Between calls the modules show the host tensors they had
(stock's ``offload_device``), while the runtime computes with its own (``hidden_weights``); host memory holds both.

- ``pipe.enable_group_offload(onload_device="jax", exclude_modules=...)``: the pipeline moves (again) with every
  component but the excluded ones stored that way; the excluded ones are placed as ``pipe.to`` places them.
- ``component.enable_group_offload("jax")`` / ``apply_group_offloading(component, "jax")``: the component is marked;
  a moved pipeline holding it moves again, and a pipeline not on JAX moves when it is called (``before_call``), with
  the marked components so stored.
"""

from __future__ import annotations

import functools

import torch

from ...interop import backend
from .. import diffusers_private
from ..attach import moves, pipeline_runtime, shared_components
from ..config import TPUConfig
from ..weights.hidden_weights import HiddenWeights

_MARK = "_diffusers_tpu_group_offload"  # on a component: the config of its group offloading onto JAX
_TARGET = "_diffusers_tpu_group_offload_target"  # and the JAX device string it named ("tpu" or "jax")
GROUP_OFFLOADING = "group_offloading"  # diffusers' hook name (``hooks.group_offloading._GROUP_OFFLOADING``)


@functools.cache
def _on_jax_class():
    from diffusers.hooks import ModelHook  # noqa: PLC0415 - diffusers.hooks loads peft: only when offloading

    class OnJax(ModelHook):
        """diffusers' group-offloading hook as diffusers' own code looks for it (``_get_top_level_group_offload_hook``,
        ``_get_group_onload_device``: its ``config``); it does nothing itself: the runtime streams the weights."""

        on_jax = True  # the runtime's own (``denoiser_hooks.active_hooks`` leaves it out)

        def __init__(self, config):
            super().__init__()
            self.config = config

    return OnJax


def _is_on_jax(hook) -> bool:
    return getattr(hook, "on_jax", False)


def apply_function(stock):
    """Wrap ``diffusers.hooks.apply_group_offloading``: onto a JAX device, stock's checks run without CUDA streams
    (XLA overlaps transfers with compute itself), then ``apply_config`` marks the module."""

    @functools.wraps(stock)
    def apply_group_offloading(module, onload_device, *args, **kwargs):
        target = backend.parse_device(onload_device)
        if target is not None:  # (stock's config holds torch's name of the JAX device: "jax", or TorchTPU's)
            vars(module)[_TARGET] = target
            onload_device = backend.jax_torch_device()
            kwargs.update(use_stream=False, record_stream=False)
        return stock(module, onload_device, *args, **kwargs)

    return apply_group_offloading


def apply_config(stock, wrap_calls):
    """Wrap ``group_offloading._apply_group_offloading(module, config)`` (stock's public function and its re-apply
    after a LoRA change reach it): onto a JAX device, mark the module and give it ``OnJax``; a moved pipeline
    holding it moves again. ``wrap_calls``: makes every pipeline class's call see the mark (``before_call``)."""

    @functools.wraps(stock)
    def _apply_group_offloading(module, config):
        if backend.parse_device(config.onload_device) is None:
            return stock(module, config)
        wrap_calls()
        _mark(module, config)
        owner = shared_components.owner(module)
        stored = owner is not None and all(owner.config.in_host_memory(n) for n in _marked(owner.pipe))
        if owner is not None and owner.attached and not stored:  # (stored already: a LoRA change re-applies it)
            _move(owner.pipe, owner.target.requested, _marked(owner.pipe))
        return None

    return _apply_group_offloading


def pipeline_method(stock):
    """Wrap ``DiffusionPipeline.enable_group_offload``: onto a JAX device, stock's marks every component but
    ``exclude_modules`` (``apply_function``), then the pipeline moves with those stored in host memory."""

    @functools.wraps(stock)
    def enable_group_offload(self, *args, **kwargs):
        onload = kwargs.get("onload_device", args[0] if args else None)
        target = backend.parse_device(onload)
        if target is None:
            return stock(self, *args, **kwargs)
        runtime = pipeline_runtime.runtime_of(self)
        if runtime is not None:
            target = runtime.target.requested
            moves.detach(self)  # stock's part meets host modules (excluded ones: ``.to(onload)``)
        if "onload_device" in kwargs:
            kwargs["onload_device"] = backend.jax_torch_device()
        else:
            args = (backend.jax_torch_device(), *args[1:])
        stock(self, *args, **kwargs)
        for name in _marked(self):
            vars(getattr(self, name))[_TARGET] = target
        _move(self, target, _marked(self), runtime)
        return None

    return enable_group_offload


def before_call(pipe) -> None:
    """A pipeline holding components marked for group offloading onto JAX runs on JAX with them so stored."""
    marked = _marked(pipe)
    if not marked:
        return
    runtime = pipeline_runtime.runtime_of(pipe)
    if runtime is None or not all(runtime.config.in_host_memory(name) for name in marked):
        target = getattr(getattr(pipe, marked[0]), _TARGET, "jax")
        _move(pipe, runtime.target.requested if runtime is not None else target, marked)


def _mark(module: torch.nn.Module, config) -> None:
    from diffusers.hooks import HookRegistry  # noqa: PLC0415 - see _on_jax_class

    setattr(module, _MARK, config)
    registry = HookRegistry.check_if_exists_or_initialize(module)
    if not _is_on_jax(registry.get_hook(GROUP_OFFLOADING)):
        registry.register_hook(_on_jax_class()(config), GROUP_OFFLOADING)


def _marked(pipe) -> list[str]:
    return [n for n, m in pipe.components.items() if isinstance(m, torch.nn.Module) and hasattr(m, _MARK)]


def _move(pipe, target: str, names: list[str], runtime=None) -> None:
    """Move ``pipe`` to ``target`` with ``names`` stored in host memory, as it was moved before (``runtime``)."""
    runtime = pipeline_runtime.runtime_of(pipe) or runtime
    marks = {name: (getattr(getattr(pipe, name), _MARK), vars(getattr(pipe, name)).get(_TARGET)) for name in names}
    if pipeline_runtime.runtime_of(pipe) is not None:
        moves.detach(pipe)  # its modules hold their host tensors again (and lose their marks)
    for name, (config, requested) in marks.items():
        _mark(getattr(pipe, name), config)
        if requested is not None:
            vars(getattr(pipe, name))[_TARGET] = requested
    config = runtime.config if runtime is not None else TPUConfig.from_environment()
    stored = config.weights_in_host_memory
    if stored is not True:  # (True: every component there already)
        config = config.replace(weights_in_host_memory=tuple(sorted(set(stored or ()) | set(names))))
    modules = {name: getattr(pipe, name) for name in names}
    host = {name: _host_tensors(module) for name, module in modules.items()}
    moves.attach(pipe, target, config=config, dtype=runtime.user_dtype if runtime is not None else None)
    runtime = pipeline_runtime.runtime_of(pipe)
    hidden = runtime.hidden_weights = runtime.hidden_weights or HiddenWeights()
    for name, module in modules.items():
        if name in runtime.decision.plans:  # (a text encoder run with torch on the host keeps its own tensors)
            hidden.hide(module, shown=host[name])

    def undo():  # ``pipe.to("cpu")``: the modules hold their own tensors, and are no longer marked
        for module in modules.values():
            hidden.release(module)
            vars(module).pop(_MARK, None)
            vars(module).pop(_TARGET, None)
            registry = diffusers_private.hook_registry(module)
            if registry is not None and _is_on_jax(registry.get_hook(GROUP_OFFLOADING)):
                registry.remove_hook(GROUP_OFFLOADING, recurse=False)

    runtime.overrides.add_undo(undo, "group offload's host tensors")


def _host_tensors(module: torch.nn.Module) -> dict:
    return {
        (id(owner), name): tensor
        for owner in module.modules()
        for name, tensor in owner._parameters.items()
        if tensor is not None and tensor.device.type == "cpu"
    }
