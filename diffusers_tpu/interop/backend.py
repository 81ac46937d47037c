"""The model-agnostic backend: device strings, JAX platform, the torchax environment, and the device mesh."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import warnings
from collections.abc import Mapping, Sequence

import jax
import ml_dtypes
import numpy as np
import torch
import torchax
from jax.sharding import AxisType, Mesh
from torchax.ops import mappings
from torchax.tensor import Tensor
from torchax.view import View

from . import processes, torch_private, torchax_private
from .mesh_axes import MESH_AXES
from .torch_private import pytree

logger = logging.getLogger(__name__)

PLATFORM_ENV = "DIFFUSERS_TPU_PLATFORM"
JAX_DEVICE_TYPES = ("tpu", "jax")
_PLATFORM_ALIASES = {"cuda": "gpu", "rocm": "gpu"}


@dataclasses.dataclass(frozen=True)
class Target:
    """Where a pipeline goes: the device string the user wrote and the JAX platform it resolves to."""

    requested: str  # "tpu" or "jax"
    platform: str  # a JAX platform name: "tpu", "cpu" or "gpu"

    @property
    def torch_device(self) -> torch.device:
        return jax_torch_device()


def jax_torch_device() -> torch.device:
    """The torch device JAX tensors report: torch's private backend as named now, torchax's "jax" or, beside TorchTPU,
    its "tpu" (``shared_device``: the one device shared)."""
    return torch.device(torch_private.private_use1_name(), 0)


def parse_device(device) -> str | None:
    """Return "tpu" or "jax" when ``device`` names a JAX target, else None (a torch device for stock diffusers)."""
    if device is None or isinstance(device, torch.dtype):
        return None
    if isinstance(device, torch.device):  # torchax's device, or TorchTPU's "tpu" it shares (``shared_device``)
        return "jax" if device.type in ("jax", "privateuseone") else "tpu" if device.type == "tpu" else None
    if not isinstance(device, str):
        return None
    kind, _, index = device.partition(":")
    kind = kind.strip().lower()
    if kind not in JAX_DEVICE_TYPES:  # (beside TorchTPU too: a pipeline's "tpu" is the JAX path, ``shared_device``)
        return None
    if index not in ("", "0"):
        raise ValueError(
            f"pipe.to({device!r}): a JAX pipeline spans the whole device mesh, so a device index is not "
            f"meaningful. Use pipe.to({kind!r}) and choose devices with TPUConfig(mesh=...)."
        )
    return kind


def resolve_target(kind: str) -> Target:
    """Resolve "tpu"/"jax" to a JAX platform that has devices, or raise a clear error (nothing moved yet)."""
    if kind == "jax":
        return Target("jax", jax.default_backend())
    platform = os.environ.get(PLATFORM_ENV, "tpu").strip().lower() or "tpu"
    platform = _PLATFORM_ALIASES.get(platform, platform)
    if platform not in ("tpu", "cpu", "gpu"):
        raise ValueError(f"{PLATFORM_ENV}={platform!r} is not a JAX platform; use tpu, cpu or gpu.")
    try:
        devices = jax.devices(platform)
    except RuntimeError:
        devices = []
    if not devices:
        available = sorted({d.platform for d in jax.devices()})
        if platform == "tpu":
            raise RuntimeError(
                f"pipe.to('tpu') found no TPU: JAX sees only {available} devices. To run the identical path on "
                f"this machine's default JAX platform use pipe.to('jax'), or set {PLATFORM_ENV}=cpu (or gpu) so "
                "that 'tpu' rehearses on another platform. On a TPU VM, install jax[tpu]."
            )
        raise RuntimeError(
            f"{PLATFORM_ENV}={platform} but JAX has no {platform} devices (it sees {available}). Unset "
            f"{PLATFORM_ENV} or set it to one of {available}."
        )
    return Target("tpu", platform)


def device_for(platform: str) -> str:
    """The ``pipe.to`` device for a command line's ``--platform``: "cpu"/"gpu" pick the JAX platform "tpu" resolves to
    (``DIFFUSERS_TPU_PLATFORM``), "auto" a TPU when there is one, else JAX's default."""
    if platform in ("cpu", "gpu"):
        os.environ[PLATFORM_ENV] = platform
        return "tpu"
    if platform == "auto":
        return "tpu" if any(d.platform == "tpu" for d in jax.devices()) else "jax"
    return platform


def devices_for(target: Target) -> list:
    """Every process's devices, each host's together: the mesh's leading axis (dp) then runs across hosts and its
    last (tp, whose all-reduces come every layer) within a host, over the fast local interconnect."""
    return sorted(jax.devices(target.platform), key=lambda d: (d.process_index, d.id))


# --- torchax environment ---------------------------------------------------------------------------------
def env():
    """The torchax environment all our work runs in (the default one: ``interop.call_torch`` uses it under jit)."""
    return torchax.default_env()


def _modes_active(environment) -> bool:
    # Not ``environment.enabled``: torchax's dispatch enters and exits the environment around every op, which
    # resets that flag while the outer modes are still on torch's stack.

    return any(mode is torchax_private.dispatch_mode(environment) for mode in torch_private.dispatch_modes())


@contextlib.contextmanager
def jax_mode():
    """Run torch code on torchax tensors (re-entrant)."""
    environment = env()
    if _modes_active(environment):
        yield environment
        return
    with warnings.catch_warnings():
        # torchax runs JAX with x64 off by design: models' int64/float64 casts become 32-bit.
        warnings.filterwarnings("ignore", message="Explicitly requested dtype .*64", category=UserWarning)
        environment.enable_torch_modes()
        try:
            yield environment
        finally:
            environment.disable_torch_modes()


@contextlib.contextmanager
def torch_mode():
    """Run plain torch code even inside the torchax environment (e.g. a text encoder kept on the host)."""
    if not _modes_active(env()):
        yield
        return
    with torch_private.plain_torch():
        yield


def is_jax_tensor(value) -> bool:
    return isinstance(value, (Tensor, View))


def synchronize(value) -> None:
    """Wait until the JAX tensors in ``value`` (any pytree) are computed; for CUDA tensors, the CUDA stream."""
    tensors = [x for x in pytree.tree_leaves(value) if isinstance(x, torch.Tensor)]
    arrays = [x.jax() for x in tensors if is_jax_tensor(x)]
    if arrays:
        jax.block_until_ready(arrays)
    elif any(x.device.type == "cuda" for x in tensors):
        torch.cuda.synchronize()


def to_jax_array(value) -> jax.Array:
    if isinstance(value, jax.Array):
        return value
    if is_jax_tensor(value):
        return value.jax()
    return host_to_jax(value)


_FLOAT8 = {
    getattr(torch, name): getattr(ml_dtypes, name)
    for name in ("float8_e4m3fn", "float8_e5m2")
    if hasattr(torch, name) and hasattr(ml_dtypes, name)
}
_FLOAT8_TORCH = {np.dtype(numpy_type): torch_type for torch_type, numpy_type in _FLOAT8.items()}


def host_array(tensor: torch.Tensor) -> np.ndarray:
    """A CPU torch tensor as the numpy array JAX takes: bfloat16 without a float32 detour, 64-bit types as 32-bit
    (JAX runs with x64 off, as torchax does)."""
    tensor = tensor.detach().cpu().contiguous()
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.uint16).numpy().view(ml_dtypes.bfloat16)
    if tensor.dtype in _FLOAT8:  # numpy has no float8: the same bits through uint8
        return tensor.view(torch.uint8).numpy().view(_FLOAT8[tensor.dtype])
    array = tensor.numpy()
    if array.dtype == np.float64:
        return array.astype(np.float32)
    if array.dtype == np.int64:
        return array.astype(np.int32)
    return array


def host_to_jax(tensor: torch.Tensor, sharding=None) -> jax.Array:
    """Copy a CPU torch tensor to JAX (sharded if given; see ``processes.place`` for several processes). A transfer,
    not a program: ``jnp.asarray`` would compile one per shape. The copy keeps the JAX array from sharing the tensor's
    memory (JAX on the CPU adopts aligned host buffers), which the caller may still change in place."""
    array = host_array(tensor)
    return processes.place(array, sharding) if sharding is not None else jax.device_put(np.array(array, copy=True))


def jax_to_host(array: jax.Array, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Gather a JAX array to a CPU torch tensor (optionally cast back to ``dtype``)."""
    host = processes.fetch(array)  # every process gets the whole array
    if host.dtype == jax.numpy.bfloat16:
        tensor = torch.from_numpy(host.view(np.uint16).copy()).view(torch.bfloat16)
    elif host.dtype in _FLOAT8_TORCH:
        tensor = torch.from_numpy(np.asarray(host).view(np.uint8).copy()).view(_FLOAT8_TORCH[host.dtype])
    else:
        tensor = torch.from_numpy(np.array(host))
    return tensor.to(dtype) if dtype is not None and tensor.dtype != dtype else tensor


def jax_dtype(dtype: torch.dtype):
    return mappings.t2j_dtype(dtype)


def wrap(array: jax.Array):
    """A torchax tensor view of a JAX array."""
    return Tensor(array, env())


# --- mesh ------------------------------------------------------------------------------------------------
def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def default_mesh_shape(num_devices: int, num_heads: int | None, pair_batch: bool = True) -> dict[str, int]:
    """dp=2 for the guidance pair when the count is even, tp as large as the heads allow, sp takes the rest.
    ``pair_batch=False`` (the guidance pair runs as two calls, e.g. under a step cache): dp=1."""
    return default_mesh_shapes(num_devices, num_heads, pair_batch)[0]


def default_mesh_shapes(num_devices: int, num_heads: int | None, pair_batch: bool = True) -> list[dict[str, int]]:
    """``default_mesh_shape`` first, then the same with smaller tp (sp taking the rest): for a model some weight
    of which a larger tp does not divide."""
    dp = 2 if num_devices % 2 == 0 and pair_batch else 1
    rest = num_devices // dp
    tps = sorted((d for d in divisors(rest) if num_heads is None or num_heads % d == 0), reverse=True) or [1]
    return [{"dp": dp, "sp": rest // tp, "tp": tp} for tp in tps]


def validate_mesh_shape(shape: Mapping[str, int], num_devices: int, num_heads: int | None) -> dict[str, int]:
    full = {axis: 1 for axis in shape} | {axis: 1 for axis in MESH_AXES if axis not in shape}
    full.update(shape)
    product = int(np.prod(list(full.values())))
    if product != num_devices:
        raise ValueError(
            f"TPUConfig(mesh={dict(shape)}) spans {product} devices but there are {num_devices}; the product of "
            f"dp*sp*tp must equal {num_devices}, e.g. {default_mesh_shape(num_devices, num_heads)}."
        )
    if num_heads is not None and num_heads % full["tp"] != 0:
        good = [d for d in divisors(num_devices) if num_heads % d == 0]
        raise ValueError(
            f"The model has {num_heads} attention heads, which tp={full['tp']} does not divide: tensor parallelism "
            f"splits heads evenly. Choose tp from {good} (and move the other devices to dp or sp)."
        )
    return full


def build_mesh(shape: Mapping[str, int], devices: Sequence) -> Mesh:
    """A mesh over ``devices`` whose axis order is the key order of ``shape``. Auto axes: torchax reshapes
    sharded dimensions, which explicit axes reject."""
    names = tuple(shape)
    grid = np.asarray(devices, dtype=object).reshape(tuple(shape[name] for name in names))
    return Mesh(grid, names, axis_types=(AxisType.Auto,) * len(names))


_cache_dir_we_set: str | None = None
_unusable_cache_dirs: set = set()  # said once each


_JAX_MIN_COMPILE_TIME = 1.0  # jax_persistent_cache_min_compile_time_secs's default
_min_compile_time_we_replaced = None


def enable_compile_cache(directory: str | None) -> None:
    """Point JAX's persistent compilation cache at ``directory``; None turns off a cache this package turned on
    (a cache the user configured in JAX themselves is left alone)."""
    global _cache_dir_we_set, _min_compile_time_we_replaced
    current = jax.config.jax_compilation_cache_dir
    if directory is None:
        if current is None or current != _cache_dir_we_set:
            return
    elif current == directory:
        return
    else:
        try:
            os.makedirs(directory, exist_ok=True)
            if not os.access(directory, os.W_OK):
                raise PermissionError("not writable")
        except OSError as error:  # the run goes on without a persistent cache, said once
            if directory not in _unusable_cache_dirs:
                _unusable_cache_dirs.add(directory)
                logger.warning(
                    "the compilation cache %s cannot be used (%s): running without one; set "
                    "TPUConfig(compile_cache_dir=...) or DIFFUSERS_TPU_CACHE_DIR to a folder you can write",
                    directory,
                    error,
                )
            directory = None
            if current is None or current != _cache_dir_we_set:
                return
    if current is not None and directory is not None:
        logger.info("JAX compilation cache moves from %s to %s", current, directory)
    jax.config.update("jax_compilation_cache_dir", directory)
    _cache_dir_we_set = directory
    # JAX caches only programs that took over 1 s to compile; a pipeline's small programs (its eager glue: ~20 a
    # first call) would then compile again in every new process. Cache them all, unless the user set a threshold.
    if directory is not None and jax.config.jax_persistent_cache_min_compile_time_secs == _JAX_MIN_COMPILE_TIME:
        _min_compile_time_we_replaced = _JAX_MIN_COMPILE_TIME
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    elif directory is None and _min_compile_time_we_replaced is not None:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", _min_compile_time_we_replaced)
        _min_compile_time_we_replaced = None
    try:
        from jax.experimental.compilation_cache import compilation_cache  # noqa: PLC0415 - absent in older JAX

        compilation_cache.reset_cache()  # the cache object binds its directory on first use
    except Exception:  # pragma: no cover - older JAX without reset
        pass
