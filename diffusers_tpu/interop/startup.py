"""What ``import diffusers_tpu`` settles before JAX may start, without importing torch or JAX (standard library
only): the command line reads its arguments before either loads, yet user code may touch JAX right after the import.

- libtpu on a host without TPU chips stays quiet (``quiet_absent_libtpu``);
- whether the environment names a multi-host run (``in_a_cluster``): then the cluster starts at import
  (``distributed.initialize_from_env``), before any code can touch a JAX backend;
- torchax imports on this torch, whoever imports it (``torchax_importable``);
- two known messages that are noise on every run are silenced (``quiet_known_noise``).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
import warnings

from . import import_hooks, jax_private, patching

_applied: set[str] = set()

# Reason: with libtpu installed (the ``tpu`` extra: the TPU compiler, used without a TPU by ``plan`` and ``cost``),
# JAX's first device query on a host with no TPU chip loads libtpu as a backend; it fails (JAX falls back to the next
# platform) after printing six lines about an accelerator type and worker hostnames it cannot find, and leaves a
# lockfile that a second process loading libtpu (a test worker, a ``plan`` subprocess) fails on. Told both, and not
# to query the GCE metadata server, it starts silently and shares. JAX itself counts the host's TPU chips
# (``jax._src.hardware_utils``, standard library only: read here from its file, without importing JAX); the
# variables are set only then, and only if unset.
# Guard: only with libtpu installed and no TPU chip attached; a real TPU host keeps libtpu's own defaults and lock.
QUIET_LIBTPU = {
    "TPU_SKIP_MDS_QUERY": "1",
    "TPU_WORKER_HOSTNAMES": "localhost",
    "TPU_ACCELERATOR_TYPE": "v6e-4",
    "ALLOW_MULTIPLE_LIBTPU_LOAD": "1",
}


def quiet_absent_libtpu() -> None:
    if importlib.util.find_spec("libtpu") is None or jax_private.tpu_chips():
        return
    set_here = [name for name in QUIET_LIBTPU if name not in os.environ]
    for name in set_here:
        os.environ[name] = QUIET_LIBTPU[name]
    _applied.add("quiet libtpu without TPU chips")
    patching.record("quiet libtpu without TPU chips", lambda: [os.environ.pop(name, None) for name in set_here])


def in_a_cluster() -> bool:
    """The environment names a multi-host run (``interop.distributed``'s variables, or a Cloud TPU slice's worker
    list of several hosts)."""
    env = os.environ
    hosts = env.get("TPU_PROCESS_ADDRESSES") or env.get("TPU_WORKER_HOSTNAMES") or ""
    return bool(env.get("DIFFUSERS_TPU_COORDINATOR")) or env.get("DIFFUSERS_TPU_DISTRIBUTED") == "1" or "," in hosts


def applied() -> set[str]:
    return set(_applied)


# torchax 0.0.10-0.0.13's modules that name aten ops and overloads torch 2.13 and 2.14 removed (``torch_itself``:
# "torchax imports on torch >= 2.13").
TORCHAX_MODULES_NAMING_REMOVED_OPS = ("torchax.amp", "torchax.decompositions", "torchax.ops.jaten")


def torchax_importable() -> None:
    """Have torchax's modules that name removed aten ops run inside ``torch_itself``'s tolerance when imported, and
    torchax itself share torch's private device where TorchTPU named it first (``shared_device``)."""
    for name in TORCHAX_MODULES_NAMING_REMOVED_OPS:
        if name not in sys.modules:
            import_hooks.while_importing(name, _removed_names_tolerated)
    if "torchax" not in sys.modules:
        import_hooks.while_importing("torchax", _device_shared)


def _device_shared():
    from .compat import shared_device  # noqa: PLC0415 - imports torch: only once torchax loads, never at import

    return shared_device.torchax_import()


def _removed_names_tolerated():
    from .compat import torch_itself  # noqa: PLC0415 - imports torch: only once torchax loads, never at import

    return torch_itself.removed_aten_names_tolerated()


# Known noise, silenced at its source and nowhere else, before anything can log it.
# Reason: a user should see the project's own lines and real problems (README's first command is tested to print no
# warning). Two messages are noise on every run and are not about anything the user did:
# - transformers 5 without torchvision: "`CLIPImageProcessor` requires torchvision (not installed); falling back to
#   `CLIPImageProcessorPil`", logged when diffusers imports its pipelines; the PIL processor is the one transformers 4
#   used, and what these pipelines need. Only that message of that logger is dropped.
# - JAX's at-fork hook ("os.fork() was called ... will likely lead to a deadlock") when ``subprocess`` starts ffmpeg
#   for ``export_to_video``: the child replaces itself with ffmpeg at once (fork+exec), no JAX runs in it. Only forks
#   made by the ``subprocess`` module are matched; ``os.fork`` and multiprocessing still warn.
# Guard: message texts of transformers 5.x and jax 0.6-0.10; other messages and other modules are untouched.
_TORCHVISION_FALLBACK = "requires torchvision (not installed); falling back to"


def _torchvision_fallback_filter(record) -> bool:
    return _TORCHVISION_FALLBACK not in str(record.msg)


def quiet_known_noise() -> None:
    import_utils_logger = logging.getLogger("transformers.utils.import_utils")
    if _torchvision_fallback_filter not in import_utils_logger.filters:
        import_utils_logger.addFilter(_torchvision_fallback_filter)
    warnings.filterwarnings("ignore", message=r"os\.fork\(\) was called", category=RuntimeWarning, module="subprocess")
    fork_filter = warnings.filters[0]
    _applied.add("known noise silenced")

    def undo():
        import_utils_logger.removeFilter(_torchvision_fallback_filter)
        if fork_filter in warnings.filters:
            warnings.filters.remove(fork_filter)
        _applied.discard("known noise silenced")

    patching.record("known noise silenced", undo)
