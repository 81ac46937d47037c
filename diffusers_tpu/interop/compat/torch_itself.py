"""Patches of torch itself, each with its reason and version guard, each set through ``patching.wrap``: what the
torch version in use, and torchax's claim on torch's private backend, need changed in torch. The torchax-behaviour
patches are in ``compat``. Imports nothing of the package but ``patching`` and ``torch_private``.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import logging
import sys
import warnings

import torch

from .. import patching, torch_private

# --- torchax imports on torch >= 2.13 ------------------------------------------------------------------
# Reason: torchax 0.0.10-0.0.13 name aten ops and overloads that newer torch removed, in tables built when their
# modules execute: ~22 named-tensor overloads (e.g. ``aten.prod.dim_Dimname``: gone in torch 2.13) in
# ``torchax/amp.py`` and ``torchax/decompositions.py``, and the deprecated ``aten.cholesky`` and ``aten.qr`` (gone in
# torch 2.14: ``torch.linalg.cholesky`` / ``qr`` dispatch to ``linalg_cholesky_ex`` / ``linalg_qr``, which torchax
# lowers) in ``amp.py`` and ``torchax/ops/jaten.py``. While those modules execute, and only then, such a name
# resolves to an inert placeholder, which their tables hold but never dispatch (torch cannot produce those ops any
# more). ``import diffusers_tpu`` has their bodies run inside ``removed_aten_names_tolerated``
# (``startup.torchax_importable``: no torch import until then), so ``import torchax`` works anywhere after it.
# Guard: only the names listed here; a no-op for a torch that still has them. Checked on torch 2.13.0, 2.14.1, 2.15.0.
_NAMED_TENSOR_MARKERS = ("dimname", "names")
REMOVED_OPS = ("cholesky", "qr")  # removed from ``torch.ops.aten`` in torch 2.14


class _RemovedOverload:
    """Stands in for an aten op or overload that torch no longer has; never called."""

    def __init__(self, name: str):
        self.name = name

    def __getattr__(self, key: str):  # a removed op's overloads (``aten.cholesky.default``)
        if key.startswith("__"):
            raise AttributeError(key)
        return _RemovedOverload(f"{self.name}.{key}")

    def __repr__(self) -> str:  # pragma: no cover - debugging aid
        return f"<removed aten name {self.name}>"


@contextlib.contextmanager
def removed_aten_names_tolerated():
    """Inside: a named-tensor overload or an op of ``REMOVED_OPS`` that torch removed resolves to a
    ``_RemovedOverload``."""
    packet_cls, namespace_cls = torch_private.OpOverloadPacket, torch_private.OpNamespace
    packet_getattr, namespace_getattr = packet_cls.__getattr__, namespace_cls.__getattr__

    def overload_or_placeholder(self, key):
        try:
            return packet_getattr(self, key)
        except AttributeError:
            if any(marker in key.lower() for marker in _NAMED_TENSOR_MARKERS):
                return _RemovedOverload(f"{self._qualified_op_name}.{key}")
            raise

    def op_or_placeholder(self, key):
        try:
            return namespace_getattr(self, key)
        except AttributeError:
            if getattr(self, "name", None) == "aten" and key in REMOVED_OPS:
                return _RemovedOverload(f"aten.{key}")
            raise

    with patching.temporarily(
        {(packet_cls, "__getattr__"): overload_or_placeholder, (namespace_cls, "__getattr__"): op_or_placeholder}
    ):
        yield
    patching.record("torchax-removed-aten-names")


# --- torch.compiler.is_compiling() is True while JAX traces a program ---------------------------------
# Reason: a JAX trace is a compilation, and library code already knows what to do then: diffusers bypasses its
# Python-side caches of tensors (``lru_cache_unless_export``: Qwen-Image's rotary tables, which a trace would leak as
# tracers into later programs) and transformers avoids data-dependent branches. Outside our traces the stock answer.
# Guard: wraps ``torch.compiler.is_compiling`` (torch >= 2.3) once.
tracing: contextvars.ContextVar[bool] = contextvars.ContextVar("diffusers_tpu_tracing", default=False)


def _patch_is_compiling():
    compiler = getattr(torch, "compiler", None)
    if getattr(compiler, "is_compiling", None) is None:
        return

    def make(stock):
        @functools.wraps(stock)
        def is_compiling() -> bool:
            return tracing.get() or stock()

        return is_compiling

    patching.wrap(compiler, "is_compiling", make, "torch.compiler.is_compiling during JAX traces")


# --- torch.accelerator answers as if torchax had not claimed it ---------------------------------------------
# Reason: torchax renames torch's private backend to "jax" and registers a device module for it, so torch reports
# "jax" as the process's accelerator, while the C++ hooks behind ``torch.accelerator`` do not exist for it. Every
# ``torch.compile`` then fails in dynamo's stream tracking ("PyTorch is not linked with support for jax devices",
# measured on the CPU and on an H100), and diffusers' ``get_device()`` says "jax" where stock says "cuda" or "cpu".
# The module's functions now serve CUDA when it is available (``torch.cuda``'s own functions), else report no
# accelerator, as stock torch does. Pipelines on JAX never go through ``torch.accelerator``.
# Guard: only while torch's accelerator is torchax's renamed backend (torch >= 2.6 has ``torch.accelerator``).
_CUDA_NAMES = {
    "current_device_idx": "current_device",
    "current_device_index": "current_device",
    "set_device_idx": "set_device",
    "set_device_index": "set_device",
    "device_index": "device",
    "get_memory_info": "mem_get_info",
    "empty_host_cache": "empty_cache",
}


def _patch_accelerator():
    accelerator = getattr(torch, "accelerator", None)
    claimed = getattr(torch._C, "_accelerator_getAccelerator", lambda: None)()
    if accelerator is None or claimed is None or claimed.type != "jax" or "torch.accelerator" in patching.applied():
        return
    cuda = torch.cuda.is_available()

    def no_accelerator(name):
        def refuse(*args, **kwargs):
            raise RuntimeError(
                f"torch.accelerator.{name}: no accelerator in this process (torchax's 'jax' device is "
                "not a torch accelerator; JAX devices are reached through pipe.to('tpu'))."
            )

        return refuse

    replacements = {
        "current_accelerator": lambda check_available=False: torch.device("cuda") if cuda else None,
        "is_available": lambda: cuda,
        "device_count": torch.cuda.device_count if cuda else (lambda: 0),
    }
    for name in accelerator.__all__:
        if name not in replacements:
            target = getattr(torch.cuda, _CUDA_NAMES.get(name, name), None) if cuda else None
            replacements[name] = target if target is not None else no_accelerator(name)
    for name, function in replacements.items():
        patching.replace(accelerator, name, function, "torch.accelerator")
    _forget_detected_device()
    patching.record("torch.accelerator", _forget_detected_device)  # undone first: the stock answers come back


def _forget_detected_device() -> None:
    utils = sys.modules.get("diffusers.utils.torch_utils")  # diffusers caches its answer on first use
    detect = getattr(getattr(utils, "TorchDeviceBackend", None), "_detect_device_type", None)
    if hasattr(detect, "cache_clear"):
        detect.cache_clear()


# --- Outside a pipeline call, the 'jax' device is the host --------------------------------------------------------
# Reason: between calls no torchax environment is active, so torch's own code meets the 'jax' device:
# ``tensor.to("jax")`` failed in the device guard ("PyTorch is not linked with support for jax devices") and the
# factories (``torch.randn(..., device="jax")``) in their ``empty`` kernels. GPU scripts and diffusers' own tests make
# a pipeline's inputs there between calls. A pipeline on JAX takes host tensors and moves them itself (with the
# sharding it chooses), so outside a call such a tensor is made on the host: the same values (a CPU generator draws
# what it draws on stock CPU), reported as ``cpu``, moved by the next pipeline call. Inside a call torchax's mode
# takes the 'jax' device before any of this. Guard: a Python device guard for the PrivateUse1 key torchax renamed to
# 'jax' (``torch._C._acc.register_python_privateuseone_device_guard``, torch >= 2.5) and the two ``empty`` kernels
# every factory and copy reaches; without the guard API, the factories are refused with ``JaxDeviceOutsideCall``.
# Guard too: only while the private backend is torchax's "jax" (beside TorchTPU it is TorchTPU's "tpu", with its own
# kernels: ``shared_device``).
class JaxDeviceOutsideCall(RuntimeError):
    """A tensor made on the 'jax' device outside a pipeline call, where this torch cannot hold one on the host."""


_FACTORY_KERNELS: list = []
_told = []


def _tell_once() -> None:
    if not _told:
        _told.append(True)
        logging.getLogger("diffusers_tpu").warning(
            "A tensor made or moved onto the 'jax' device outside a pipeline call is kept on the host (device "
            "'cpu'); a pipeline on JAX moves its inputs to the devices itself."
        )


def _host_empty(size, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    _tell_once()
    return torch.empty(size, dtype=dtype, layout=layout, memory_format=memory_format)


def _host_empty_strided(size, stride, *, dtype=None, layout=None, device=None, pin_memory=None):
    _tell_once()
    return torch.empty_strided(size, stride, dtype=dtype, layout=layout)


def _refuse_factory(*args, **kwargs):
    raise JaxDeviceOutsideCall(
        "A tensor made or moved onto the 'jax' device outside a pipeline call (torch.randn(..., device='jax'), "
        "tensor.to('jax'), module.to('jax')): this torch has no 'jax' kernels there. Create it on the CPU "
        "(device='cpu'): a pipeline on JAX takes CPU tensors (latents=, prompt_embeds=, ...) and moves them itself; "
        "move whole pipelines with pipe.to('jax')."
    )


def _on_the_host(op):
    def host(*args, **kwargs):
        _tell_once()
        return op(*args, **{**kwargs, "device": torch.device("cpu")})

    return host


class _HostDeviceGuard(getattr(getattr(torch._C, "_acc", None), "DeviceGuard", object)):
    def type_(self):
        return torch_private.private_use1()


def _patch_jax_factories() -> None:
    if _FACTORY_KERNELS or torch_private.private_use1_name() != "jax":  # beside TorchTPU: its kernels and guard
        return
    register_guard = getattr(getattr(torch._C, "_acc", None), "register_python_privateuseone_device_guard", None)
    library = torch.library.Library("aten", "IMPL")  # a kernel for an existing op on one more key
    if register_guard is not None:
        register_guard(_HostDeviceGuard())
        library.impl("empty.memory_format", _host_empty, "PrivateUse1")
        library.impl("empty_strided", _host_empty_strided, "PrivateUse1")
        # TorchTPU installed on a host without TPU chips registers its kernels for the key at import but never names
        # the device (torchax does): its factories and copies would run for "jax" ("to_copy(): expected at least one
        # of the inputs to be on 'tpu' device"). Those that take a device make host tensors instead, as above.
        with warnings.catch_warnings():  # torch warns that a kernel is overridden: that is the point
            warnings.simplefilter("ignore", UserWarning)
            for name, op in torch_private.private_use1_kernels_taking_a_device():
                if name not in ("aten::empty.memory_format", "aten::empty_strided"):
                    library.impl(name.removeprefix("aten::"), _on_the_host(op), "PrivateUse1")
    else:
        for op in ("empty.memory_format", "empty_strided"):
            library.impl(op, _refuse_factory, "PrivateUse1")
    _FACTORY_KERNELS.append(library)  # held: the registrations last as long as the library object


def apply() -> None:
    """Apply the patches of torch (idempotent); torchax must be imported."""
    _patch_accelerator()  # first: library code may ask torch for the accelerator as soon as torchax is in
    _patch_is_compiling()
    _patch_jax_factories()
