"""Run a function once a module has finished importing: at once if it already has, else right after its import.

``import diffusers_tpu`` must stay cheap (the command line answers ``--help`` without loading torch, and a script
pays for no diffusers model it never uses), yet ``DiffusionPipeline.to`` and peft's adapter methods must be patched
before a user calls them. Importing ``diffusers.pipelines.pipeline_utils`` alone costs about two seconds, peft over
one: each patch waits for its module instead (``when_imported``). A module that cannot import on this torch as it
is (torchax's, on torch 2.13) runs its body inside a context that makes it importable (``while_importing``).
Standard library only: this module runs before torch or JAX is imported.
"""

from __future__ import annotations

import importlib.abc
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager

_waiting: dict[str, list[Callable]] = {}
_around: dict[str, Callable[[], AbstractContextManager]] = {}


def when_imported(name: str, callback: Callable) -> None:
    """``callback(module)`` once module ``name`` is imported: now if it is, else as soon as its body has run."""
    module = sys.modules.get(name)
    if module is not None and not _initializing(module):
        callback(module)
        return
    _waiting.setdefault(name, []).append(callback)
    _install()


def while_importing(name: str, context: Callable[[], AbstractContextManager]) -> None:
    """Run module ``name``'s body inside ``context()`` whenever it is imported (not yet: it must not be in
    ``sys.modules``); ``context`` is called at that time, so it may import what the module itself needs."""
    if name in sys.modules:
        raise RuntimeError(f"{name} is imported already: its body cannot run inside {context!r} any more")
    _around[name] = context
    _install()


def _install() -> None:
    if not any(isinstance(finder, _Finder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _Finder())


def _initializing(module) -> bool:
    return bool(getattr(getattr(module, "__spec__", None), "_initializing", False))


class _Finder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for a waited-for or wrapped module it asks the other finders, then wraps the loader's
    ``exec_module`` on that module's own loader instance, so everything else about the module stays stock."""

    def find_spec(self, fullname, path, target=None):
        if fullname not in _waiting and fullname not in _around:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        stock_exec = loader.exec_module

        def exec_module(module):
            try:
                if fullname in _around:
                    with _around[fullname]():
                        stock_exec(module)
                else:
                    stock_exec(module)
            finally:
                vars(loader).pop("exec_module", None)  # the instance attribute only: the class method again
            while fullname in _waiting:  # a callback may ask for the same module (the import is still finishing)
                for callback in _waiting.pop(fullname):
                    callback(module)

        loader.exec_module = exec_module
        return spec


def forget_all() -> None:
    """Drop every waiting callback and wrapper, and the finder with them (``diffusers_tpu.deactivate``): modules
    imported from now on import as stock."""
    _waiting.clear()
    _around.clear()
    sys.meta_path[:] = [finder for finder in sys.meta_path if not isinstance(finder, _Finder)]
