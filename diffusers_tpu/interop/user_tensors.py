"""What crosses between the user's torch code and JAX.

The design: **tensors that leave the library are CPU torch tensors.** A moved pipeline's public entry points
(``pipe(...)``, ``vae.encode`` / ``vae.decode``, ``encode_prompt``, a direct ``pipe.transformer(...)`` call, text and
image encoders on the devices) return ordinary host tensors when called from user code, and what a step callback
receives is host tensors too — so ``.cpu()``, ``.numpy()``, arithmetic with CPU tensors, ``postprocess_video`` and
``export_to_video`` all work as on stock torch. Inputs may be CPU tensors or tensors the library returned. Inside a
pipeline call the same methods pass JAX tensors to each other and nothing moves to the host.

A callback's returned tensors go back to the devices (with the sharding of the tensor they replace); an unchanged
tensor (same object, not modified in place) is not transferred back at all.
"""

from __future__ import annotations

import copy
import dataclasses

import torch

from . import backend
from .torch_private import pytree


def to_cpu(value):
    if backend.is_jax_tensor(value):
        return backend.jax_to_host(value.jax())
    if (
        not isinstance(value, torch.Tensor)
        and type(value).__module__.startswith("diffusers")
        and any(backend.is_jax_tensor(v) for v in getattr(value, "__dict__", {}).values())
    ):
        # e.g. vae.encode(...).latent_dist (DiagonalGaussianDistribution): a copy holding host tensors
        host = copy.copy(value)
        host.__dict__.update({k: to_cpu(v) for k, v in vars(value).items()})
        return host
    return value


def _tree_map(function, value):
    # diffusers' outputs are pytree nodes through their dict items, which omit fields set to None: rebuilding
    # ``StableDiffusionPipelineOutput(images=...)`` then fails for want of ``nsfw_content_detected``. Map such an
    # output field by field instead.
    if dataclasses.is_dataclass(value) and not isinstance(value, type) and isinstance(value, dict):
        return type(value)(
            **{f.name: _tree_map(function, getattr(value, f.name)) for f in dataclasses.fields(value) if f.init}
        )
    return pytree.tree_map(function, value)


def to_host(value):
    """JAX tensors in ``value`` (any pytree) become CPU torch tensors."""
    return _tree_map(to_cpu, value)


def to_device(value):
    """CPU torch tensors in ``value`` (any pytree) become JAX tensors (call inside the JAX context)."""

    def move(x):
        if isinstance(x, torch.Tensor) and not backend.is_jax_tensor(x) and x.device.type != "meta":
            return backend.wrap(backend.host_to_jax(x))
        return x

    return _tree_map(move, value)


def like(value, original):
    """A tensor a callback returned, back on the devices with ``original``'s sharding when the shape allows."""
    if not isinstance(value, torch.Tensor) or backend.is_jax_tensor(value):
        return value
    sharding = original.jax().sharding if backend.is_jax_tensor(original) and original.shape == value.shape else None
    return backend.wrap(backend.host_to_jax(value, sharding))


def host_callback(callback, outside):
    """Wrap a ``callback_on_step_end(pipe, step, timestep, tensors)``: it sees host tensors and runs as user code
    (``outside()``: plain torch, the library's entry points convert again); what it returns goes back to JAX."""

    def call(pipe, step, timestep, tensors):
        host = {name: to_host(value) for name, value in tensors.items()}
        given = dict(host)  # callbacks often edit the dict they receive and return it
        versions = {name: value._version for name, value in host.items() if isinstance(value, torch.Tensor)}
        with outside():
            result = callback(pipe, step, to_host(timestep), host)
        if result is None:
            return result
        back = {}
        for name, value in result.items():
            unchanged = (
                name in given
                and value is given[name]
                and isinstance(value, torch.Tensor)
                and value._version == versions.get(name)
            )
            back[name] = tensors[name] if unchanged else like(value, tensors.get(name))
        return back

    call.__wrapped__ = callback
    return call
