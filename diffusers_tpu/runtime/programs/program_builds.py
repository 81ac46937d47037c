"""How the runtime turns a lowered program into the executable its calls run: XLA's compile effort, and tiers.

The TPU compiler spends minutes on a float32 3-D VAE decoder at its default effort (each distinct convolution shape
costs it tens of seconds) and a small fraction of that at XLA's effort level O0 (``jax_private.QUICK_COMPILE``; the
``exec_time_optimization_effort=-1`` of jax 0.10; BENCHMARKS.md, "Time to ready"). The effort does not change what a
program computes — the same optimized HLO semantics, the traced matmul precision kept — only how hard XLA works on its
speed; the quick program's run time on a TPU is not measured
yet (no TPU here). ``TPUConfig.vae_compile`` chooses for the VAE's programs (the denoiser step always compiles at
full effort: it runs every step, and compiles in seconds):

- ``"quick"``: effort level O0;
- ``"full"``: XLA's default effort;
- ``"tiered"``: the quick program serves at once; the full one is built on a background thread and replaces it at
  the first call after it is built, when the devices' free memory then holds what it needs (else the quick one
  keeps serving). A later process finds the full one in JAX's persistent cache (``TPUConfig.compile_cache_dir``)
  and builds only it;
- ``"auto"`` (default): quick on TPU; full elsewhere (XLA:CPU ignores the effort).
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from collections.abc import Callable

import jax

from ...interop import compile_accounting, jax_private

logger = logging.getLogger(__name__)

QUICK = jax_private.QUICK_COMPILE  # XLA's effort level O0; the default is its own choice
_pending: set[Tiered] = set()  # tiered programs whose full build is still running
_pending_lock = threading.Lock()


def resolve(mode: str, platform: str) -> str:
    """``TPUConfig.vae_compile`` on a platform: "quick", "full" or "tiered"."""
    if mode == "auto":
        return "quick" if platform == "tpu" else "full"
    return mode


def builder(mode: str, platform: str, cache_dir: str | None = None, store=None) -> Callable:
    """The ``jit.CompiledFunction(build=...)`` for a mode; ``cache_dir``: where tiered programs note that their full
    build is in the persistent cache (None: not noted, each process starts quick); ``store``: a
    ``program_store.ProgramStore`` programs load from (and what compiles is saved to)."""
    mode = resolve(mode, platform)
    if mode == "tiered":
        return lambda lowered: Tiered(lowered, cache_dir, store)
    options = QUICK if mode == "quick" else {}
    if store is None:
        return quick if options else compile_accounting.compile_now

    def build(lowered):
        return _stored_build(lowered, options, store)

    build.compiler_options = options or None
    return build


def _stored_build(lowered, options: dict, store):
    """The program from ``store``, or compiled with ``options`` (and saved there)."""
    loaded = store.load(lowered, options) if store is not None else None
    if loaded is not None:
        return loaded
    compiled, cached = compile_accounting.from_persistent_cache(lambda: lowered.compile(options or None))
    if store is not None and not cached:  # (JAX's cache keeps it; its copy cannot be written again)
        store.save(lowered, options, compiled)
    return compiled


def quick(lowered) -> jax.stages.Compiled:
    return lowered.compile(QUICK)


quick.compiler_options = QUICK  # (a program called with other argument layouts: jit compiles it the same way)


class BuildOf:
    """A lowered program as the runtime builds it, for ``plan`` and ``cost`` (what they analyse must be the program
    that runs): ``compile()`` applies the build's options; everything else is the lowered program's."""

    def __init__(self, lowered, options: dict, tier: str):
        self.lowered, self.options, self.tier = lowered, dict(options), tier
        self.label = getattr(lowered, "label", None)  # what it is, for progress lines

    def compile(self, compiler_options: dict | None = None):
        return self.lowered.compile({**self.options, **(compiler_options or {})} or None)

    def __getattr__(self, name):
        return getattr(self.lowered, name)


def builds(lowered, mode: str, platform: str) -> list[BuildOf]:
    """The builds the runtime makes of ``lowered`` in ``mode`` (``TPUConfig.vae_compile``): one, or a tiered
    program's two (quick, full)."""
    tiers = {"quick": [("quick", QUICK)], "full": [("full", {})], "tiered": [("quick", QUICK), ("full", {})]}
    return [BuildOf(lowered, options, tier) for tier, options in tiers[resolve(mode, platform)]]


class Tiered:
    """An executable that starts as the quick build of a program and becomes its full build (module docstring)."""

    def __init__(self, lowered, cache_dir: str | None = None, store=None):
        self.full = self.error = None
        self._note, self._store = _note_path(lowered, cache_dir), store
        stored = store.load(lowered, {}) if store is not None else None
        if stored is not None or (self._note is not None and os.path.exists(self._note)):
            # built in full before: from the programs folder, or a persistent-cache load
            self.full = self.current = stored if stored is not None else lowered.compile()
            self._thread = None
            return
        self.current = _stored_build(lowered, QUICK, store)
        self._thread = threading.Thread(target=self._build_full, args=(lowered,), daemon=True)
        self._thread.name = "diffusers-tpu-full-build"
        with _pending_lock:
            _pending.add(self)
        self._thread.start()

    def _build_full(self, lowered) -> None:
        try:
            with compile_accounting.background_compiles():
                self.full, cached = compile_accounting.from_persistent_cache(lowered.compile)
            if self._note is not None:
                _write_note(self._note)
            if self._store is not None and not cached:
                self._store.save(lowered, {}, self.full)
        except Exception as error:  # noqa: BLE001 (the quick program keeps serving; say why once)
            self.error = error
            logger.warning("the full-effort build of a VAE program failed; its quick build keeps serving: %s", error)
        finally:
            with _pending_lock:
                _pending.discard(self)

    @property
    def out_info(self):
        return self.current.out_info

    @property
    def tier(self) -> str:
        return "full" if self.current is self.full else "quick"

    def memory_analysis(self):
        return self.current.memory_analysis()

    def __call__(self, *args):
        full = self.full
        if full is not None and self.current is not full and fits(full):
            self.current = full
        return self.current(*args)

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the full build; whether it is done."""
        if self._thread is not None:
            self._thread.join(timeout)
        return self.full is not None or self.error is not None


def wait_for_builds(timeout: float | None = None) -> bool:
    """Wait for every tiered program's background build (``warm_up`` and tests); whether all are done."""
    with _pending_lock:
        pending = list(_pending)
    return all(program.wait(timeout) for program in pending)


def fits(executable) -> bool:
    """Whether the devices' free memory now holds what ``executable`` allocates beyond its arguments (its
    temporaries and new outputs). Platforms that report no memory (CPU) always fit."""
    analysis = executable.memory_analysis()
    if analysis is None:
        return True
    need = analysis.temp_size_in_bytes + analysis.output_size_in_bytes - analysis.alias_size_in_bytes
    for sharding in jax.tree_util.tree_leaves(executable.input_shardings):
        for device in sharding.device_set:
            stats = device.memory_stats() if device.process_index == jax.process_index() else None
            if stats and "bytes_limit" in stats and stats["bytes_limit"] - stats.get("bytes_in_use", 0) < need:
                return False
        break  # every argument lives on the program's devices: one sharding names them
    return True


def _note_path(lowered, cache_dir: str | None) -> str | None:
    if cache_dir is None:
        return None
    identity = f"{jax.__version__} {jax.default_backend()} {os.environ.get('LIBTPU_INIT_ARGS', '')}\n"
    digest = hashlib.sha256((identity + lowered.as_text()).encode()).hexdigest()[:32]
    return os.path.join(cache_dir, "full-builds", digest)


def _write_note(path: str) -> None:
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w"):
            pass
    except OSError:  # a read-only cache: the next process starts quick again
        pass
