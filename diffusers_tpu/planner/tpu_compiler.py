"""The real TPU compiler on a machine without a TPU ("deviceless" ahead-of-time compilation).

With libtpu installed (``pip install "diffusers-tpu[tpu]"``, i.e. ``jax[tpu]``), JAX describes a TPU slice from its
topology name (``v6e:2x4``) and compiles programs for it with no chip attached: sharded over a ``Mesh`` of those
devices, ``jit(f).lower(...).compile()`` runs XLA's TPU passes and Mosaic's (the Pallas kernels) and answers with the
program's memory analysis, cost analysis and optimized HLO. ``plan`` and ``cost`` use it for TPU targets
(``chips.Chip.topology``); nothing here runs a program.

libtpu is loaded once per process, quietly and shareably on a host without TPU chips (``startup.quiet_absent_libtpu``).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import re
import threading
import time

import jax
from jax.experimental import topologies

from ..interop import jax_private, startup
from . import hlo_stats
from .chips import CHIPS, Chip


class Unavailable(RuntimeError):
    """The TPU compiler was asked for where libtpu is not installed."""


def available() -> bool:
    """Whether libtpu (the TPU compiler) is installed."""
    return importlib.util.find_spec("libtpu") is not None


def install_hint() -> str:
    return (
        f'install the TPU compiler (libtpu, ~700 MB; no TPU needed): pip install "jax[tpu]=={jax.__version__}" '
        '(or pip install -e ".[tpu]" in a checkout)'
    )


@functools.cache
def load_failure() -> str | None:
    """Why libtpu, though installed, cannot describe a TPU slice here (a damaged install, one mismatched with jax), in
    one line; None when it can (or is not installed: ``available`` says that)."""
    if not available():
        return None
    try:
        _devices("v6e:2x2")
    except Exception as error:  # noqa: BLE001 (any failure to load is this answer, never a bare JAX message)
        return f"{type(error).__name__}: {str(error).strip().splitlines()[0][:200] if str(error).strip() else ''}"
    return None


def started() -> bool:
    """Whether libtpu may have started in this process (it reads its flags, ``LIBTPU_INIT_ARGS``, then and only then):
    after JAX's first device query (which tries every platform) or a deviceless topology."""
    return jax_private.backends_initialized() or _devices.cache_info().currsize > 0


def usable() -> bool:
    """Whether the TPU compiler can compile here: libtpu installed and loading."""
    return available() and load_failure() is None


def require(what: str = "a TPU compile") -> None:
    if not available():
        raise Unavailable(f"{what} needs libtpu, which is not installed: {install_hint()}.")
    failure = load_failure()
    if failure is not None:
        raise Unavailable(f"{what} needs libtpu, which is installed but does not load ({failure}): {install_hint()}.")


def chip_of(target: str | Chip) -> Chip:
    if isinstance(target, Chip):
        return target
    if target not in CHIPS:
        raise ValueError(f"Unknown TPU slice {target!r}; choose one of {', '.join(tpu_slices())}.")
    return CHIPS[target]


def tpu_slices() -> list[str]:
    """The ``--chips`` names the TPU compiler can compile for."""
    return [name for name, chip in CHIPS.items() if chip.topology]


def _topology_options(topology: str) -> dict:
    generation, _, shape = topology.partition(":")
    options = {}
    if all(int(n) == 1 for n in shape.split("x")):
        options["chips_per_host_bounds"] = (1, 1, 1)  # one chip: libtpu's default host of 2x2 chips refuses 1x1
    if generation in ("v4", "v5p"):
        options["chip_config_name"] = "megacore"  # one JAX device per chip, as on those slices' VMs
    return options


@functools.cache
def _devices(topology: str) -> tuple:
    startup.quiet_absent_libtpu()  # (done at package import; again for a process that imported only this module)
    return tuple(
        topologies.get_topology_desc(platform="tpu", topology_name=topology, **_topology_options(topology)).devices
    )


def devices(target: str | Chip) -> list:
    """The JAX devices of a TPU slice (``--chips`` name or ``Chip``) to compile for, in the order JAX lists them."""
    chip = chip_of(target)
    if chip.topology is None:
        raise Unavailable(f"libtpu has no topology for this target ({chip}); it is planned by the CPU estimate.")
    require(f"compiling for {chip.topology}")
    try:
        found = list(_devices(chip.topology))
    except Exception as error:  # noqa: BLE001 (a topology libtpu cannot describe: the same advice as a broken install)
        raise Unavailable(
            f"libtpu could not describe {chip.topology} ({type(error).__name__}: {error}): {install_hint()}."
        )
    if len(found) != chip.devices:
        raise RuntimeError(f"libtpu's {chip.topology} has {len(found)} devices, expected {chip.devices}.")
    return found


def is_tpu(devices_) -> bool:
    return bool(devices_) and getattr(devices_[0], "platform", None) == "tpu"


def is_attached(devices_) -> bool:
    """Whether the devices are this process's real ones (a TPU VM), not a topology described for compiling."""
    try:
        local = {d.id for d in jax.local_devices(backend=devices_[0].platform)}
    except RuntimeError:  # no such backend in this process: described devices only
        return False
    return all(d in jax.devices(devices_[0].platform) for d in devices_) and bool(local)


_REFUSAL = re.compile(
    r"(RESOURCE_EXHAUSTED|Ran out of memory|exceeds|vmem|VMEM|Mosaic failed|INVALID_ARGUMENT|"
    r"UNIMPLEMENTED)",
    re.IGNORECASE,
)


def refusal(error: BaseException) -> str | None:
    """The TPU compiler's reason, in one line, when ``error`` is a compile-time refusal (memory over HBM or VMEM,
    a kernel Mosaic rejects); None for anything else (a bug: let it raise)."""
    if not isinstance(error, (jax.errors.JaxRuntimeError, ValueError, RuntimeError)):
        return None
    text = str(error)
    if not _REFUSAL.search(text):
        return None
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    useful = [line for line in lines if _REFUSAL.search(line)] or lines
    line = useful[0]
    return line if len(line) <= 300 else line[:297] + "..."


def _identity(devices) -> str:
    try:
        libtpu = importlib.metadata.version("libtpu")
    except importlib.metadata.PackageNotFoundError:
        libtpu = "?"
    kinds = sorted({d.device_kind for d in devices})
    return f"jax {jax.__version__} libtpu {libtpu} {kinds} x{len(devices)}"


def remembered(analyse, devices, directory: str | None):
    """``analyse(lowered) -> dict`` (a JSON-able report of a compiled program), remembered on disk in ``directory``
    for programs compiled for TPU ``devices``: the same program (its lowered text), compiled by the same libtpu
    for the same chips, is analysed once per machine. The TPU compiler takes minutes for some programs (the Wan VAE's
    float32 3-D convolutions: each becomes several bf16 passes, each compiled) that a plan needs every time."""
    if directory is None or not is_tpu(devices):
        return analyse
    identity = _identity(devices) + " " + getattr(analyse, "__qualname__", repr(analyse))

    def cached(lowered) -> dict:
        options = json.dumps(getattr(lowered, "options", {}), sort_keys=True)  # a build's compile options
        digest = hashlib.sha256((identity + options + "\n" + lowered.as_text()).encode()).hexdigest()[:32]
        path = os.path.join(directory, "tpu-analyses", f"{digest}.json")
        try:
            with open(path) as handle:
                return dict(json.load(handle), remembered=True)
        except (OSError, ValueError):
            pass
        report = analyse(lowered)
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            temporary = f"{path}.{os.getpid()}.tmp"
            with open(temporary, "w") as handle:
                json.dump(report, handle, default=str)
            os.replace(temporary, path)  # atomic: a concurrent plan never reads half a file
        except OSError:
            pass  # a read-only cache: the analysis is still returned
        return report

    return cached


def announced(analyse, every: float = 30.0):
    """``analyse`` saying what the TPU compiler is doing: a long compile (over ``every`` seconds) prints which
    program it is (``lowered.label``, its build's tier) and for how long so far, then when it is done."""

    def run(lowered):
        label = getattr(lowered, "label", None) or "a program"
        tier = getattr(lowered, "tier", None)
        name = f"{label} [{tier}]" if tier else label
        done, start = threading.Event(), time.perf_counter()

        def beat():
            while not done.wait(every):
                print(f"  the TPU compiler is still compiling {name} ({time.perf_counter() - start:.0f} s)", flush=True)

        threading.Thread(target=beat, daemon=True).start()
        try:
            return analyse(lowered)
        finally:
            done.set()
            seconds = time.perf_counter() - start
            if seconds >= every:
                print(f"  compiled {name} in {seconds:.0f} s", flush=True)

    return run


def compiled_figures(lowered) -> dict:
    """Compile ``lowered``: its memory, cost and instruction figures (``hlo_stats.summary``), compile seconds."""
    start = time.perf_counter()
    compiled = lowered.compile()
    return hlo_stats.summary(compiled, seconds=time.perf_counter() - start)


# XLA's quick effort: a real-size step compiles in about a quarter of the time (Wan2.1-14B 720p, v6e-8: 11 s vs 44 s
# on 2 cores) with the same FLOPs and collectives; its bytes and temporaries differ a little (BENCHMARKS.md)
QUICK_EFFORT = jax_private.QUICK_COMPILE


def quick_figures(lowered) -> dict:
    """``compiled_figures`` of the program compiled at XLA's quick effort (``plan`` screens candidates with it)."""
    start = time.perf_counter()
    compiled = lowered.compile(QUICK_EFFORT)
    return dict(hlo_stats.summary(compiled, seconds=time.perf_counter() - start), effort="quick")
