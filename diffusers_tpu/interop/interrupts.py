"""Ctrl-C that Python would drop, raised again at the next safe point.

JAX adds a garbage-collector callback (``jax._src.lib``: XLA frees buffers on each collection). CPython runs a pending
SIGINT's handler at the next bytecode of whatever Python code runs, and an exception raised inside a gc callback (or a
``__del__``, a weakref finalizer) cannot propagate: CPython reports it as "Exception ignored" and carries on. Tracing
and lowering allocate heavily, so a Ctrl-C during a compile often lands in that callback, and the run went on to the
end (and replaced the user's file).

``watch()`` (around a pipeline call, and around a whole command) turns such a dropped ``KeyboardInterrupt`` (CPython
hands it to ``sys.unraisablehook``) into a flag; ``raise_if_dropped()`` raises it at the next safe point: each
denoising step, the end of a call, before an output is written. Only the main thread's calls raise it: signals are
delivered there. Imports nothing of the package.
"""

from __future__ import annotations

import contextlib
import sys
import threading

_lock = threading.Lock()
_watchers = 0
_previous_hook = None
_dropped = threading.Event()


def _hook(unraisable) -> None:
    if isinstance(unraisable.exc_value, KeyboardInterrupt):
        _dropped.set()  # raised again by ``raise_if_dropped``; not printed (it is not lost)
        return
    (_previous_hook or sys.__unraisablehook__)(unraisable)


@contextlib.contextmanager
def watch():
    """Inside: a ``KeyboardInterrupt`` CPython drops is kept for ``raise_if_dropped``. Nests; the hook that was there
    before is back when the outermost block ends. Leaving the outermost block of the main thread raises a kept one."""
    global _watchers, _previous_hook
    with _lock:
        if _watchers == 0:
            _previous_hook, sys.unraisablehook = sys.unraisablehook, _hook
        _watchers += 1
    outermost_exit = False
    try:
        yield
        raise_if_dropped()
    finally:
        with _lock:
            _watchers -= 1
            if _watchers == 0:
                sys.unraisablehook, _previous_hook = _previous_hook, None
                outermost_exit = True
        if outermost_exit and threading.current_thread() is threading.main_thread():
            _dropped.clear()  # raised above, or the block ended with an error of its own


def raise_if_dropped() -> None:
    """Raise the ``KeyboardInterrupt`` CPython dropped since the last check (main thread only)."""
    if _dropped.is_set() and threading.current_thread() is threading.main_thread():
        _dropped.clear()
        raise KeyboardInterrupt
