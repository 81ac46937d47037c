"""Schedulers whose tables device timesteps index.

DDIM-style schedulers look up ``alphas_cumprod[timestep]`` in a CPU tensor (scheduling_ddim.py, scheduling_dpm_cogvideox.py
in diffusers 0.42) with a timestep that lives on the device in a JAX pipeline: torch cannot index a CPU tensor
with a torchax one. Moving those tables to the device (on the pipeline's scheduler object, undone on
``pipe.to("cpu")``) fixes it without forking a scheduler; the values are unchanged.
"""

from __future__ import annotations

import torch

from .backend import host_to_jax, is_jax_tensor, wrap

# scheduler class name -> tensor attributes indexed or mixed with device timesteps
DEVICE_TABLES = {
    "DDIMScheduler": ("alphas_cumprod", "final_alpha_cumprod"),
    "CogVideoXDDIMScheduler": ("alphas_cumprod", "final_alpha_cumprod"),
    "CogVideoXDPMScheduler": ("alphas_cumprod", "final_alpha_cumprod"),
}


def place(scheduler) -> list:
    """Move the scheduler's tables to JAX; returns undo callables."""
    undo = []
    for cls in type(scheduler).__mro__:
        names = DEVICE_TABLES.get(cls.__name__)
        if names is not None:
            break
    else:
        return undo
    for name in names:
        value = getattr(scheduler, name, None)
        if isinstance(value, torch.Tensor) and not is_jax_tensor(value):
            setattr(scheduler, name, wrap(host_to_jax(value)))
            undo.append(lambda name=name, value=value: setattr(scheduler, name, value))
    return undo
