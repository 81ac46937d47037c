"""Every private name of torch the project uses, behind one door: each says why no public API serves and was checked on
torch 2.13.0, 2.14.1 and 2.15.0 (``CHECKED_ON``); ``tests/interop/test_private_apis.py`` fails when a release changes
one. Patches of torch itself are in ``torch_itself``.
"""

from __future__ import annotations

import contextlib

import torch

# torch's pytree. Why private: torch has no public pytree module (2.13-2.15); torchax and diffusers use this one, so
# their containers are registered here and nowhere else.
import torch.utils._pytree as pytree  # noqa: F401 - re-exported
from torch.nn.utils.stateless import _reparametrize_module
from torch.utils._python_dispatch import _disable_current_modes, _get_current_dispatch_mode_stack

CHECKED_ON = ("2.13.0", "2.14.1", "2.15.0")

# An aten operator overload, packet and namespace (``torch._ops``). Why private: torch exports no public name for the
# types, and the host-side glue (``host_scalars``) and torchax's tables (``torch_itself``) dispatch on them.
OpOverload = torch._ops.OpOverload
OpOverloadPacket = torch._ops.OpOverloadPacket
OpNamespace = torch._ops._OpNamespace

# The C methods behind ``float(t)``, ``int(t)``, ``bool(t)``. Why private: recognising them in a torch-function
# handler is how a scalar read is told from other methods (``host_scalars``).
TENSOR_TO_PYTHON = (torch._C.TensorBase.__float__, torch._C.TensorBase.__int__, torch._C.TensorBase.__bool__)


@contextlib.contextmanager
def plain_torch():
    """Inside: no dispatch mode (torchax's environment) and no torch-function override is active, so torch computes on
    its own CPU tensors. Why private: ``_disable_current_modes`` and ``DisableTorchFunction`` are torch's only ways."""
    with _disable_current_modes(), torch._C.DisableTorchFunction():
        yield


def dispatch_modes() -> list:
    """The active torch dispatch modes, innermost last (``_get_current_dispatch_mode_stack``). Why private: torch has
    no public reader; ``backend`` asks whether torchax's environment is among them."""
    return _get_current_dispatch_mode_stack()


def reparametrized(module: torch.nn.Module, tensors: dict):
    """Context: ``module`` runs with ``tensors`` (name -> tensor) in place of its parameters and buffers, untied. Why
    private: ``torch.func.functional_call`` calls the module itself and ties weights; the compiled paths need the
    substitution around calls they make themselves (``jit``, ``runtime.repeated_blocks``)."""
    return _reparametrize_module(module, tensors)


def private_use1_name() -> str:
    """The name torch's private backend has now: ``"privateuseone"`` until a package renames it (torchax: ``"jax"``,
    TorchTPU: ``"tpu"``; torch allows one rename). Why private: torch reads it only internally
    (``torch._C._get_privateuse1_backend_name``, what ``rename_privateuse1_backend`` checks)."""
    return torch._C._get_privateuse1_backend_name()


def private_use1_kernels_taking_a_device() -> list[tuple[str, object]]:
    """The aten ops with a kernel registered for the private key that take a ``device`` argument, as (name, op). Why
    private: ``_dispatch_get_registrations_for_dispatch_key`` is torch's only listing of a key's kernels."""
    found = []
    for name in torch._C._dispatch_get_registrations_for_dispatch_key("PrivateUse1"):
        namespace, _, rest = name.partition("::")
        packet, _, overload = rest.partition(".")
        op = getattr(getattr(getattr(torch.ops, namespace, None), packet, None), overload or "default", None)
        if namespace == "aten" and op is not None and any(a.name == "device" for a in op._schema.arguments):
            found.append((name, op))
    return found


def private_use1():
    """The ``DeviceType`` torchax registers its device under (``torch._C._autograd.DeviceType.PrivateUse1``)."""
    return torch._C._autograd.DeviceType.PrivateUse1


def deregister(node_type: type) -> None:
    """Forget a pytree node type registered with ``pytree.register_pytree_node`` (``diffusers_tpu.deactivate``). Why
    private: torch offers registration only; ``_deregister_pytree_node`` is its one way back."""
    if node_type in pytree.SUPPORTED_NODES:
        pytree._deregister_pytree_node(node_type)
