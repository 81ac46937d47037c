"""``pipe.enable_model_cpu_offload(device="tpu" | "jax")``: diffusers' model offload, on JAX.

Each component's weights stay on the host between uses: placed on the devices (sharded as ``pipe.to`` decided) when
the component runs, sent back to the host when the next one in ``model_cpu_offload_seq`` starts, and after a call
every component is on the host again — what a 16 GB chip needs for a text encoder and a denoiser that do not fit
together. The hooks are accelerate's ``CpuOffload`` (diffusers reads them: ``_execution_device``,
``maybe_free_model_hooks``, ``apply_forward_hook`` around ``vae.decode``), with the move replaced by the runtime's
placement; the compiled programs see the same shapes and shardings each time, so nothing recompiles. Results equal
the un-offloaded run's. Text encoders the runtime keeps on the host need no move.
"""

from __future__ import annotations

import torch
from accelerate.hooks import CpuOffload, UserCpuOffloadHook, add_hook_to_module, remove_hook_from_module
from diffusers.utils.torch_utils import get_device

from ...interop import backend, sharding
from ..attach import gpu_script_calls, pipeline_runtime


class DeviceOffload(CpuOffload):
    """accelerate's model-offload hook for a component of a pipeline on JAX: ``init_hook`` (and ``offload``) sends
    its weights to the host, ``pre_forward`` places them (after the previous component's go back)."""

    places_on_use = True  # the runtime leaves such a component's weights where the hook put them

    def __init__(self, runtime, name: str, prev_module_hook=None):
        super().__init__(execution_device=runtime.target.torch_device, prev_module_hook=prev_module_hook)
        self.runtime, self.name = runtime, name
        if name not in runtime.decision.plans:  # kept on the host (text encoders): its inputs stay there too
            self.execution_device = None

    def init_hook(self, module):
        if self.name in self.runtime.decision.plans and self.runtime.attached:
            sharding.restore(module)
        return module

    def pre_forward(self, module, *args, **kwargs):
        if self.prev_module_hook is not None:
            self.prev_module_hook.offload()
        if self.runtime.attached and self.name in self.runtime.decision.plans:
            with backend.torch_mode():
                self.runtime.put_on_devices(self.name)
        return args, kwargs


def requested_target(args, kwargs) -> str | None:
    """The JAX target an ``enable_model_cpu_offload`` call names (``device=``, or ``gpu_id`` then ``device``)."""
    device = gpu_script_calls.offload_device(args, kwargs)
    return backend.parse_device(device) if device is not None else None


def handles(pipe, args, kwargs) -> bool:
    """Whether this ``enable_model_cpu_offload`` call is JAX's: it names a JAX device, the pipeline is on JAX, or it
    names none on a machine where stock finds no accelerator (stock would raise; JAX is the accelerator here)."""
    if requested_target(args, kwargs) is not None or pipeline_runtime.runtime_of(pipe) is not None:
        return True
    return gpu_script_calls.offload_device(args, kwargs) is None and get_device() == "cpu"


def enable(pipe, args, kwargs) -> None:
    """Attach ``pipe`` (if it is not on JAX yet) and give each component an offload hook, in the pipeline's order."""
    if pipe.model_cpu_offload_seq is None:
        raise ValueError(
            "Model CPU offload cannot be enabled because no `model_cpu_offload_seq` class attribute is set."
        )
    remove(pipe)
    runtime = pipeline_runtime.runtime_of(pipe)
    if runtime is None:  # on JAX already: its own devices, whichever JAX device string the call names
        pipe.to(requested_target(args, kwargs) or "jax")
        runtime = pipeline_runtime.runtime_of(pipe)
    pipe._offload_device = runtime.target.torch_device
    modules = {name: m for name, m in pipe.components.items() if isinstance(m, torch.nn.Module)}
    pipe._all_hooks, previous = [], None
    ordered = [name for name in pipe.model_cpu_offload_seq.split("->") if name in modules]
    for name in ordered + [n for n in modules if n not in ordered and n not in pipe._exclude_from_cpu_offload]:
        hook = DeviceOffload(runtime, name, prev_module_hook=previous if name in ordered else None)
        add_hook_to_module(modules[name], hook)
        user_hook = UserCpuOffloadHook(modules[name], hook)
        pipe._all_hooks.append(user_hook)
        previous = user_hook if name in ordered else previous
    runtime.overrides.add_undo(lambda: remove(pipe), "model offload hooks")


def remove(pipe) -> None:
    """Take the offload hooks off (``pipe.to("cpu")`` and a second ``enable_model_cpu_offload``)."""
    for module in pipe.components.values():
        if isinstance(module, torch.nn.Module) and isinstance(getattr(module, "_hf_hook", None), DeviceOffload):
            remove_hook_from_module(module)
    pipe._all_hooks = []
