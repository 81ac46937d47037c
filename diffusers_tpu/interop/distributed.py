"""Multi-host runs (JAX's multi-controller model): one process per host, the same script on every host.

``import diffusers_tpu`` calls ``jax.distributed.initialize`` when the environment says so, before anything touches
a JAX backend:

- ``DIFFUSERS_TPU_COORDINATOR=host:port``, ``DIFFUSERS_TPU_NUM_PROCESSES=N``, ``DIFFUSERS_TPU_PROCESS_ID=i``: an
  explicit cluster (any platform; on CPU the collectives run over gloo, which is how a pod is rehearsed here);
- on a multi-host Cloud TPU slice (detected from ``TPU_WORKER_HOSTNAMES`` or the TPU VM's metadata) with no
  arguments: JAX reads the slice's topology itself. ``DIFFUSERS_TPU_DISTRIBUTED=1`` forces that auto-detected
  initialization (SLURM, Open MPI, Kubernetes clusters), ``=0`` turns it off.

Failing fast and clearly (docs/faults.md): process 0 checks the coordinator's port is free before
JAX binds it; processes that do not all join within ``DIFFUSERS_TPU_INIT_TIMEOUT`` seconds (default 60) get an error
naming the expected count; a process that stops sending heartbeats for ``DIFFUSERS_TPU_HEARTBEAT_TIMEOUT`` seconds
(default 20) is declared dead and every other process exits non-zero naming it (a heartbeat through the
cluster's key-value store, watched by a thread; JAX's own heartbeat, at four times the time, is the backstop).

After that ``jax.devices()`` is every process's devices and the mesh spans them all (``backend.build_mesh``);
arrays cross the host boundary through ``processes``.
"""

from __future__ import annotations

import atexit
import errno
import glob
import os
import socket
import sys
import threading
import time

import jax

from . import jax_private

COORDINATOR_ENV = "DIFFUSERS_TPU_COORDINATOR"
NUM_PROCESSES_ENV = "DIFFUSERS_TPU_NUM_PROCESSES"
PROCESS_ID_ENV = "DIFFUSERS_TPU_PROCESS_ID"
SWITCH_ENV = "DIFFUSERS_TPU_DISTRIBUTED"
INIT_TIMEOUT_ENV = "DIFFUSERS_TPU_INIT_TIMEOUT"  # seconds every process waits for all of them to join
HEARTBEAT_TIMEOUT_ENV = "DIFFUSERS_TPU_HEARTBEAT_TIMEOUT"  # seconds of silence before a process counts as dead
DEFAULT_INIT_TIMEOUT, DEFAULT_HEARTBEAT_TIMEOUT = 60, 20

_initialized_here = False


def _int_env(name: str, default: int | None = None) -> int:
    value = os.environ.get(name, "")
    if default is not None and not value.strip():
        return default
    try:
        number = int(value)
    except ValueError:
        number = None
    if number is None or (default is not None and number < 1):
        kind = "a positive number of seconds" if default is not None else "an integer"
        raise ValueError(
            f"{name}={value!r} must be {kind} (set it with {COORDINATOR_ENV} for a multi-process run, "
            "before `import diffusers_tpu`)."
        )
    return number


def _check_port_free(coordinator: str) -> None:
    """Process 0 hosts the coordinator: its port must be free, checked here because JAX's own bind failure can
    crash the process (a segfault in gRPC's add_port about one run in six) instead of raising."""
    port = int(coordinator.rsplit(":", 1)[1])
    for family, address in ((socket.AF_INET6, "::"), (socket.AF_INET, "0.0.0.0")):
        try:
            probe = socket.socket(family, socket.SOCK_STREAM)
        except OSError:
            continue  # no IPv6 on this host
        with probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC binds: TIME_WAIT is no conflict
            try:
                probe.bind((address, port))
                return
            except OSError as error:
                if family == socket.AF_INET6 and error.errno != errno.EADDRINUSE:
                    continue  # IPv6 present but unusable: try IPv4
                raise RuntimeError(
                    f"{COORDINATOR_ENV}={coordinator}: port {port} is already in use on this host (process 0 hosts "
                    f"the coordinator there): {error.strerror}. Stop the run that holds it, or choose a free port "
                    f"in {COORDINATOR_ENV} for every process."
                ) from None


def _multi_host_tpu_slice() -> bool:
    """A Cloud TPU slice of several hosts: the worker list in the environment (GKE) or, on a TPU VM (TPU device
    files present), in the VM's metadata, as JAX's own cluster detection reads it."""
    hosts = os.environ.get("TPU_PROCESS_ADDRESSES") or os.environ.get("TPU_WORKER_HOSTNAMES")
    if hosts:
        return len([h for h in hosts.split(",") if h.strip()]) > 1
    if not (glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*")):
        return False
    try:
        endpoints, code = jax_private.cloud_tpu_metadata("worker-network-endpoints")
        return code == 200 and len([e for e in endpoints.split(",") if e.strip()]) > 1
    except Exception:  # not a Cloud TPU VM, or no metadata server: a single host
        return False


def initialize_from_env() -> bool:
    """Start ``jax.distributed`` if the environment asks for it; True when this process is part of a cluster."""
    global _initialized_here
    switch = os.environ.get(SWITCH_ENV, "auto").strip().lower()
    if _initialized_here or switch == "0":
        return _initialized_here
    coordinator = os.environ.get(COORDINATOR_ENV, "").strip()
    if coordinator:
        num_processes, process_id = _int_env(NUM_PROCESSES_ENV), _int_env(PROCESS_ID_ENV)
        if num_processes < 1 or not 0 <= process_id < num_processes:
            raise ValueError(f"{PROCESS_ID_ENV}={process_id} must be in [0, {NUM_PROCESSES_ENV}={num_processes}).")
        if ":" not in coordinator:
            raise ValueError(
                f"{COORDINATOR_ENV}={coordinator!r} must be host:port, e.g. 10.0.0.2:8476 (process 0's "
                "address, reachable from every process)."
            )
        if not coordinator.rsplit(":", 1)[1].isdigit():
            raise ValueError(f"{COORDINATOR_ENV}={coordinator!r} must end in a port number, e.g. 10.0.0.2:8476.")
        if process_id == 0:
            _check_port_free(coordinator)
        kwargs = dict(coordinator_address=coordinator, num_processes=num_processes, process_id=process_id)
    elif switch == "1" or _multi_host_tpu_slice():
        kwargs = {}  # JAX detects the cluster (Cloud TPU, SLURM, Open MPI, Kubernetes)
    else:
        return False
    init_timeout = _int_env(INIT_TIMEOUT_ENV, DEFAULT_INIT_TIMEOUT)
    heartbeat_timeout = _int_env(HEARTBEAT_TIMEOUT_ENV, DEFAULT_HEARTBEAT_TIMEOUT)
    # CPU processes exchange collectives over gloo (the default has none across processes); harmless elsewhere.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    expected = f"{NUM_PROCESSES_ENV}={kwargs['num_processes']}" if kwargs else "the slice's"
    missing = (
        f"diffusers_tpu: not every process joined the cluster within {init_timeout} s ({INIT_TIMEOUT_ENV}): "
        f"{expected} processes were expected at {kwargs.get('coordinator_address', 'the coordinator')}. Start "
        f"exactly that many processes, each with its own {PROCESS_ID_ENV} from 0, or set {NUM_PROCESSES_ENV} to "
        f"the number you start; check that {COORDINATOR_ENV} is process 0's address, reachable from every host."
    )
    # JAX aborts the process (a C++ fatal error, no Python exception) when its own deadlines pass: ours come first,
    # with a message that says what happened. JAX's own heartbeat is the backstop, at four times ours: JAX's client
    # beats every half timeout, so JAX may call a peer dead anywhere from half to all of its timeout after it died,
    # and at twice ours it sometimes came first (an abort, exit -6, on a loaded 2-core machine).
    watchdog = threading.Timer(init_timeout, _exit_with, (missing,))
    watchdog.daemon = True
    watchdog.start()
    try:
        jax.distributed.initialize(
            **kwargs, initialization_timeout=init_timeout + 30, heartbeat_timeout_seconds=4 * heartbeat_timeout
        )
    except (RuntimeError, ValueError) as error:
        arguments = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
        raise RuntimeError(
            f"jax.distributed.initialize({arguments}) failed: {str(error).rstrip('.')}. It "
            f"must run before anything uses JAX (import diffusers_tpu first), with {COORDINATOR_ENV}, "
            f"{NUM_PROCESSES_ENV} and {PROCESS_ID_ENV} set for every process, or on a multi-host TPU slice; "
            f"{SWITCH_ENV}=0 runs this process alone."
        ) from error
    finally:
        watchdog.cancel()
    _initialized_here = True
    _PeerWatch(heartbeat_timeout).start()
    return True


class _PeerWatch(threading.Thread):
    """Every process beats a counter in the cluster's key-value store every second and watches the others'. A peer
    whose counter stops for ``timeout`` seconds died (crashed, killed, its host lost): this process says which and
    exits non-zero, instead of waiting in a collective that never completes. A process that exits normally says so
    first (``atexit``), so finishing early is no death."""

    PREFIX = "diffusers_tpu/heartbeat/"

    def __init__(self, timeout: int):
        super().__init__(name="diffusers_tpu-peer-watch", daemon=True)
        self.client = jax_private.distributed_client()  # the client JAX's initialize connected
        self.timeout, self.me, self.count = timeout, jax.process_index(), jax.process_count()
        atexit.register(self.leave)

    def leave(self) -> None:
        try:
            self.client.key_value_set(f"{self.PREFIX}{self.me}", "left", allow_overwrite=True)
        except Exception:  # the coordinator is gone already: nothing to tell
            pass

    def run(self) -> None:
        beat, seen, reached = 0, {}, time.monotonic()
        changed = {peer: reached for peer in range(self.count) if peer != self.me}
        while True:
            beat += 1
            now = time.monotonic()
            try:
                self.client.key_value_set(f"{self.PREFIX}{self.me}", str(beat), allow_overwrite=True)
                values = {peer: self._value(peer) for peer in changed}
            except Exception as error:  # the key-value store lives in process 0's coordinator
                if now - reached > self.timeout:
                    _exit_with(
                        f"diffusers_tpu: process 0 (the coordinator) of {self.count} stopped answering for "
                        f"{self.timeout} s ({error}); it crashed or was stopped, so this process "
                        f"{self.me} exits too. See process 0's log for why; {HEARTBEAT_TIMEOUT_ENV} sets the "
                        "wait."
                    )
            else:
                reached = now
                for peer, value in values.items():
                    if value == "left":
                        changed[peer] = float("inf")  # finished normally: JAX's shutdown barrier takes it from here
                    elif value != seen.get(peer):
                        seen[peer], changed[peer] = value, now
                    elif now - changed[peer] > self.timeout:
                        _exit_with(
                            f"diffusers_tpu: process {peer} of {self.count} stopped (no heartbeat for "
                            f"{self.timeout} s: it crashed, was killed or lost its host), so this process "
                            f"{self.me} exits too. See process {peer}'s log for why; {HEARTBEAT_TIMEOUT_ENV} "
                            "sets the wait."
                        )
            time.sleep(1)

    def _value(self, peer: int) -> str | None:
        try:
            return self.client.key_value_try_get(f"{self.PREFIX}{peer}")
        except Exception as error:
            if "NOT_FOUND" in str(error) or "not found" in str(error).lower():
                return None  # not beating yet
            raise


def _exit_with(message: str) -> None:
    sys.stderr.write(message + "\n")
    sys.stderr.flush()
    os._exit(1)  # nothing ran yet: no state to save, and JAX's blocked call cannot be interrupted
