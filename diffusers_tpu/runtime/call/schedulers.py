"""Schedulers whose tables device timesteps index.

DDIM-style schedulers look up ``alphas_cumprod[timestep]`` in a CPU tensor (scheduling_ddim.py,
scheduling_dpm_cogvideox.py in diffusers 0.42) with a timestep that lives on the device in a JAX pipeline: torch cannot
index a CPU tensor with a torchax one. Moving those tables to the device for the duration of a pipeline call (on the
pipeline's scheduler object) fixes it without forking a scheduler; the values are unchanged. Between calls the scheduler
is a plain host object (``to_host``), so a scheduler swapped in after the move, or a user's own loop, just works.
"""

from __future__ import annotations

import torch

from ...interop.backend import host_to_jax, is_jax_tensor, jax_to_host, wrap
from ...interop.torch_private import pytree
from .scheduler_steps import METHODS, CompiledSchedulerMethod, ScheduleReset, Shared

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


def compile_steps(scheduler, held: dict, build=None) -> list:
    """Install the scheduler's methods as compiled programs (``scheduler_steps``) for a call; ``held`` keeps each
    scheduler's programs from call to call (by identity); ``build``: lowered -> executable (the runtime's builder;
    default: XLA's compile). Returns undo callables."""
    methods = held.get(id(scheduler))
    if methods is None or methods[0] is not scheduler:
        shared = Shared() if build is None else Shared(build=build)
        installed = {
            name: CompiledSchedulerMethod(scheduler, name, shared)
            for name in METHODS
            if callable(getattr(scheduler, name, None))
        }
        if callable(getattr(scheduler, "set_timesteps", None)):
            installed["set_timesteps"] = ScheduleReset(scheduler, shared.created)
        methods = held[id(scheduler)] = (scheduler, installed)
    held_now = vars(scheduler)
    ours = {name: method for name, method in methods[1].items() if name not in held_now}  # a user's override stays
    held_now.update(ours)

    def undo():
        for name, method in ours.items():
            if held_now.get(name) is method:
                del held_now[name]

    return [undo]


def _on_host(value):
    return jax_to_host(value.jax()) if is_jax_tensor(value) else value


def keep_dtype(scheduler, dtype: torch.dtype) -> list:
    """Make ``scheduler.step`` take and return latents in ``dtype`` (TPUConfig.scheduler_dtype). Latent-like
    tensors (2+ dims) are cast; timesteps and tables are not. Returns undo callables."""
    stock = scheduler.step

    def cast(value):
        return (
            value.to(dtype)
            if isinstance(value, torch.Tensor) and value.ndim >= 2 and value.is_floating_point()
            else value
        )

    def step(*args, **kwargs):
        args, kwargs = pytree.tree_map(cast, (args, kwargs))
        return pytree.tree_map(cast, stock(*args, **kwargs))

    step.__wrapped__ = stock
    object.__setattr__(scheduler, "step", step)
    return [lambda: vars(scheduler).pop("step", None)]


def to_host(scheduler) -> None:
    """After a call: tensors the scheduler kept (timesteps, sigmas, multistep history) become host tensors, so the
    scheduler is a plain torch object between calls (a user's own loop, ``pipe.to("cpu")``)."""
    for name, value in list(vars(scheduler).items()):
        if is_jax_tensor(value):
            setattr(scheduler, name, _on_host(value))
        elif type(value) in (list, tuple, dict) and any(is_jax_tensor(x) for x in pytree.tree_leaves(value)):
            setattr(scheduler, name, pytree.tree_map(_on_host, value))
