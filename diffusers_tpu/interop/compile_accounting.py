"""Compile accounting: what JAX compiled while a log was open (``compile_log``), and every program the process built,
as JAX counts them (``jax.monitoring``'s backend-compile events, persistent-cache loads and eager ops included)."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
from collections.abc import Callable

import jax

logger = logging.getLogger(__name__)


_BACKEND_COMPILE = "/jax/core/compile/backend_compile_duration"  # fires for persistent-cache loads too
_CACHE_HIT = "/jax/compilation_cache/cache_hits"
_COMPILE_PHASES = (
    _BACKEND_COMPILE,
    "/jax/core/compile/jaxpr_trace_duration",
    "/jax/core/compile/jaxpr_to_mlir_module_duration",
)


@dataclasses.dataclass(eq=False)  # identity: nested logs with equal counts must stay distinct in _open_logs
class CompileLog:
    """What JAX compiled while the log was open.

    ``compilations``: XLA programs obtained for new shapes or code (built, or loaded from the persistent
    cache — ``cache_hits`` of them); a warm call has none. ``seconds``: tracing, lowering and compiling.
    ``background``: programs built meanwhile on a background thread (``background_compiles``: a tiered program's
    full build), not counted in the others.
    """

    compilations: int = 0
    cache_hits: int = 0
    seconds: float = 0.0
    background: int = 0


_open_logs: list[CompileLog] = []
_listener_lock = threading.Lock()
_listening = False
_this_thread = threading.local()
# Every program JAX built in this process since ``count_programs`` (``diffusers_tpu.activate``): JAX's own count, the
# eager ops torchax runs and background builds included (``background`` says how many of them ran beside the calls).
_process = CompileLog()


@contextlib.contextmanager
def background_compiles():
    """Compilations on this thread inside the block count as ``CompileLog.background``: builds that run beside the
    calls (a tiered program's full build) are not a call's compilations."""
    _this_thread.background = True
    try:
        yield
    finally:
        _this_thread.background = False


def _on_event(event: str, **_) -> None:
    if event == _CACHE_HIT:
        _this_thread.cache_hits = getattr(_this_thread, "cache_hits", 0) + 1
        _process.cache_hits += 1
    if event == _CACHE_HIT and not getattr(_this_thread, "background", False):
        for log in list(_open_logs):
            log.cache_hits += 1


def from_persistent_cache(compile_: Callable):
    """``(compile_(), whether JAX loaded it from its persistent cache)``: an executable loaded from that cache cannot
    be serialized again (XLA:CPU's lacks its compiled functions: it fails when run)."""
    _listen()
    before = getattr(_this_thread, "cache_hits", 0)
    compiled = compile_()
    return compiled, getattr(_this_thread, "cache_hits", 0) > before


def _on_duration(event: str, duration: float, **_) -> None:
    if event not in _COMPILE_PHASES:
        return
    background = getattr(_this_thread, "background", False)
    _process.seconds += duration
    _process.compilations += event == _BACKEND_COMPILE
    _process.background += background and event == _BACKEND_COMPILE
    for log in list(_open_logs):
        if background:
            log.background += event == _BACKEND_COMPILE
            continue
        log.seconds += duration
        if event == _BACKEND_COMPILE:
            log.compilations += 1


def _listen() -> None:
    global _listening
    with _listener_lock:
        if not _listening:
            jax.monitoring.register_event_duration_secs_listener(_on_duration)
            jax.monitoring.register_event_listener(_on_event)
            _listening = True


def count_programs() -> None:
    """From now on, count every program JAX builds in this process (``process_programs``); idempotent."""
    _listen()


def process_programs() -> CompileLog:
    """What JAX built in this process since ``count_programs``, as JAX counts it (a copy)."""
    return dataclasses.replace(_process)


@contextlib.contextmanager
def compile_log():
    """Count compilations inside the block (nested logs all count)."""
    _listen()
    log = CompileLog()
    _open_logs.append(log)
    try:
        yield log
    finally:
        _open_logs.remove(log)


def compile_now(lowered: jax.stages.Lowered) -> jax.stages.Compiled:
    """The default program builder: XLA's compile with its default options (the persistent cache applies)."""
    return lowered.compile()
