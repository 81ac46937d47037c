"""torch's one private device, shared with TorchTPU (``torch-tpu``, Google's PyTorch backend for TPU).

torch has one PrivateUse1 device and lets its name be set once. torchax names it "jax" when it is imported; TorchTPU
names it "tpu" when torch loads it (its ``torch.backends`` entry point: ``import torch`` on a machine with TPU chips),
so a process with both failed in torchax's import ("register_privateuse1_backend() has already been set"). With
TorchTPU first, torchax is imported without its rename, and the one device is read this way:

- outside a pipeline call, torch's "tpu" is TorchTPU's: plain torch tensors, ``torch.Generator("tpu")``,
  ``torch.compile`` and the float32 matmul precision stay as TorchTPU made them, and ``deactivate()`` leaves them;
- a pipeline's ``to("tpu")`` (and ``to("jax")``) is this project's JAX path, as without TorchTPU;
- inside a call on JAX, torchax's environment is active and the device is JAX's: JAX tensors report ``tpu:0`` (what
  ``pipe.device`` says), and stock code's ``torch.randn(..., device=pipe.device)`` makes JAX arrays.

The project never makes a tensor or a generator on TorchTPU's device, so TorchTPU's runtime does not start: JAX holds
the chips (two runtimes would both claim them). A backend other than TorchTPU holding the name cannot be shared:
torchax's import is refused with one line naming what works.
Guard: TorchTPU 0.2.0 (``CHECKED_ON``); a process without TorchTPU is unchanged (torchax renames the device "jax").
"""

from __future__ import annotations

import contextlib

import torch

from .. import patching, torch_private

CHECKED_ON = ("0.2.0",)
TORCHAX_NAME = "jax"
UNNAMED = "privateuseone"
SHAREABLE = {"tpu": "TorchTPU (torch-tpu)"}  # a name another backend gives the device -> who gives it


class DeviceTaken(ImportError):
    """torch's private device belongs to a backend this project cannot share it with."""


def shared() -> bool:
    """Whether TorchTPU named torch's private device (and torchax shares it)."""
    return torch_private.private_use1_name() in SHAREABLE


@contextlib.contextmanager
def torchax_import():
    """Around torchax's import: where TorchTPU named the device first, torchax keeps TorchTPU's name (its rename and
    its ``torch.jax`` device module are skipped, nothing else of its import changes)."""
    name = torch_private.private_use1_name()
    if name in (UNNAMED, TORCHAX_NAME):
        yield
        return
    if name not in SHAREABLE:
        raise DeviceTaken(
            f"torch's private device is already named {name!r} by another PyTorch backend, loaded with torch: "
            "diffusers_tpu shares it only with TorchTPU's 'tpu'; start Python with TORCH_DEVICE_BACKEND_AUTOLOAD=0 "
            "(or without that backend installed) to run diffusers_tpu."
        )
    utils, rename, register = torch.utils, torch.utils.rename_privateuse1_backend, torch._register_device_module

    def rename_unless_torchax(backend: str) -> None:
        if backend != TORCHAX_NAME:
            rename(backend)

    def register_unless_torchax(device_type: str, module) -> None:
        if device_type != TORCHAX_NAME:
            register(device_type, module)

    with patching.temporarily(
        {
            (utils, "rename_privateuse1_backend"): rename_unless_torchax,
            (torch, "_register_device_module"): register_unless_torchax,
        }
    ):
        yield
    patching.record("torchax imported beside TorchTPU")


def apply() -> None:
    """Beside TorchTPU: torchax's tensors report the shared device, and its environment takes that device as its own
    (inside a call only: the environment is active then and nowhere else). Idempotent; nothing without TorchTPU."""
    if not shared():
        return
    from torchax.tensor import Environment, Tensor  # noqa: PLC0415 - torchax is imported by now (backend)
    from torchax.view import View  # noqa: PLC0415

    shared_name = torch_private.private_use1_name()
    for cls in (Tensor, View):  # torchax's own answer, torch.device("jax:0"), does not parse beside TorchTPU
        patching.wrap(
            cls,
            "device",
            lambda stock: patching.Property(lambda self: torch.device(shared_name, 0)),
            "JAX tensors report TorchTPU's device",
        )

    def routes(stock):
        def should_use_torchax_tensor(self, device):
            named = device.type if isinstance(device, torch.device) else device
            if isinstance(named, str) and named.split(":")[0].strip().lower() == shared_name:
                return True
            return stock(self, device)

        return should_use_torchax_tensor

    patching.wrap(Environment, "_should_use_torchax_tensor", routes, "the shared device is JAX's inside a call")
