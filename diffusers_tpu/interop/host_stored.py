"""A placed weight stored in the host's memory (JAX's ``pinned_host`` memory kind, ``runtime.host_memory``).

Programs take the stored array itself and move it to the devices where they read it (``weights.gathered``); torch
code that reads the weight outside a program (a VAE's ``post_quant_conv`` around its compiled decoder, the latents'
mean and std in a pipeline's own math) gets it on the devices, moved for that use: a ``HostStored`` tensor's value
is the stored array brought to the sharding programs use it with.
"""

from __future__ import annotations

import jax
import torch
import torchax
from torchax.tensor import Tensor


def _host_stored_class():
    class HostStored(Tensor):
        """A torchax tensor whose value is ``stored`` (host memory) moved to ``used`` (device memory) when read."""

        def __new__(cls, stored, used, env):
            return Tensor.__new__(cls, jax.ShapeDtypeStruct(stored.shape, stored.dtype), env)

        def __init__(self, stored, used, env):
            torch.Tensor.__init__(self)
            vars(self)["stored"], vars(self)["used"], vars(self)["_env"] = stored, used, env

        @property
        def _elem(self):
            return jax.device_put(self.stored, self.used)

        @_elem.setter
        def _elem(self, value):  # an in-place op's result goes back to host memory
            vars(self)["stored"] = jax.device_put(value, self.stored.sharding)

        @property
        def shape(self):
            return torch.Size(self.stored.shape)

        @property
        def ndim(self):
            return self.stored.ndim

    return HostStored


HostStored = None


def host_stored(stored: jax.Array, used) -> torch.Tensor:
    global HostStored
    if HostStored is None:
        HostStored = _host_stored_class()
    return HostStored(stored, used, torchax.default_env())


def is_host_stored(tensor) -> bool:
    return HostStored is not None and isinstance(tensor, HostStored)


def program_array(tensor) -> jax.Array:
    """The array a compiled program takes for a placed tensor: a host-stored one's stored array, as it is stored."""
    return tensor.stored if is_host_stored(tensor) else tensor.jax()
