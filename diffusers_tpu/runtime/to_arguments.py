"""What a ``to(...)`` call's arguments ask for, read as torch's own signatures read them: (device, dtype) in either
form, and whether the device is a JAX target (``"tpu"``, ``"jax"``). Read by ``pipe.to`` (``entry_points``) and by
the modular pipelines' refusal (``stock_classes``)."""

from __future__ import annotations

import torch

from ..interop import backend


def device_arg(args, kwargs):
    if "device" in kwargs:
        return kwargs["device"]
    return args[0] if args and not isinstance(args[0], torch.dtype) else None


def jax_target_of(args, kwargs) -> str | None:
    return backend.parse_device(device_arg(args, kwargs))


def dtype_of(args, kwargs) -> torch.dtype | None:
    if "dtype" in kwargs:
        return kwargs["dtype"]
    return next((a for a in args[:2] if isinstance(a, torch.dtype)), None)


def is_dtype_only(args, kwargs) -> bool:
    return device_arg(args, kwargs) is None and dtype_of(args, kwargs) is not None
