"""``pipe.enable_sequential_cpu_offload(device="tpu" | "jax")``: diffusers' sequential offload, on JAX.

Stock's moves each leaf layer's weights from the host to the accelerator when that layer runs (accelerate's
``AlignDevicesHook`` on every layer; the modules hold ``meta`` tensors in between). On JAX a denoiser step is one
compiled program, so the streaming happens inside it: the pipeline is moved (again) with
``TPUConfig(weights_in_host_memory=True)`` (``host_memory``) — weights in host memory, each repeated block's layer
brought to the devices where the layer loop reads it. What users and diffusers read is stock's: every offloaded
component has an ``AlignDevicesHook`` (``pipe._execution_device`` is the JAX device) and shows ``meta`` parameters
between calls, while the runtime holds its weights and gives them back to the modules for the length of each call
(``HiddenWeights``). Results equal the un-offloaded run's. ``pipe.remove_all_hooks()`` or a second
``enable_sequential_cpu_offload`` takes the hooks off (the weights come back); ``pipe.to("cpu")`` restores everything.
"""

from __future__ import annotations

import torch
from accelerate.hooks import AlignDevicesHook, add_hook_to_module, remove_hook_from_module

from ..attach import moves, pipeline_runtime
from ..config import TPUConfig
from ..weights.hidden_weights import HiddenWeights
from . import model_offload


class OffloadedToHost(AlignDevicesHook):
    """accelerate's sequential-offload hook, for a component whose weights the runtime keeps in host memory: the
    module shows ``meta`` parameters except while it (or the pipeline) runs. ``execution_device``: the JAX device, or
    None for a text encoder the runtime runs on the host."""

    places_on_use = True  # the runtime leaves its weights where they are stored (``PipelineRuntime._weights_in_place``)

    def __init__(self, hidden: HiddenWeights, execution_device):
        super().__init__(execution_device=execution_device, offload=True, io_same_device=True)
        self.hidden = hidden
        self._showing: list = []

    def init_hook(self, module):
        self.hidden.hide(module)
        return module

    def detach_hook(self, module):
        self.hidden.release(module)
        return module

    def pre_forward(self, module, *args, **kwargs):
        # A placed component's entry points show the weights themselves (``PipelineRuntime.weights_shown``), and
        # ``apply_forward_hook`` (``vae.decode``) calls ``pre_forward`` without ``post_forward``: only a text
        # encoder run with torch on the host is shown here, around its ``forward``.
        if self.execution_device is None:
            showing = self.hidden.shown()
            showing.__enter__()
            self._showing.append(showing)
        return args, kwargs

    def post_forward(self, module, output):
        if self._showing:
            self._showing.pop().__exit__(None, None, None)
        return output


def enable(pipe, args, kwargs) -> None:
    """Move ``pipe`` with its weights in host memory (again, if it is on JAX without) and hook every component."""
    remove(pipe)
    runtime = pipeline_runtime.runtime_of(pipe)
    target = model_offload.requested_target(args, kwargs) or (runtime.target.requested if runtime else "jax")
    config = runtime.config if runtime is not None else TPUConfig.from_environment()
    dtype = runtime.user_dtype if runtime is not None else None
    moves.attach(pipe, target, config=config.replace(weights_in_host_memory=True), dtype=dtype)
    runtime = pipeline_runtime.runtime_of(pipe)
    hidden = runtime.hidden_weights = HiddenWeights()
    pipe._offload_device, pipe._offload_gpu_id = runtime.target.torch_device, 0
    for name, module in pipe.components.items():
        if not isinstance(module, torch.nn.Module) or name in pipe._exclude_from_cpu_offload:
            continue
        on_devices = name in runtime.decision.plans
        add_hook_to_module(module, OffloadedToHost(hidden, runtime.target.torch_device if on_devices else None))
    runtime.overrides.add_undo(lambda: remove(pipe), "sequential offload hooks")


def remove(pipe) -> None:
    """Take the hooks off: every component shows its own weights again."""
    for module in pipe.components.values():
        if isinstance(module, torch.nn.Module) and isinstance(getattr(module, "_hf_hook", None), OffloadedToHost):
            remove_hook_from_module(module)
