"""Multi-host runs (JAX's multi-controller model): one process per host, the same script on every host.

``import diffusers_tpu`` calls ``jax.distributed.initialize`` when the environment says so, before anything touches
a JAX backend:

- ``DIFFUSERS_TPU_COORDINATOR=host:port``, ``DIFFUSERS_TPU_NUM_PROCESSES=N``, ``DIFFUSERS_TPU_PROCESS_ID=i``: an
  explicit cluster (any platform; on CPU the collectives run over gloo, which is how a pod is rehearsed here);
- on a multi-host Cloud TPU slice (detected from ``TPU_WORKER_HOSTNAMES`` or the TPU VM's metadata) with no
  arguments: JAX reads the slice's topology itself. ``DIFFUSERS_TPU_DISTRIBUTED=1`` forces that auto-detected
  initialization (SLURM, Open MPI, Kubernetes clusters), ``=0`` turns it off.

After that ``jax.devices()`` is every process's devices and the mesh spans them all (``backend.build_mesh``).
Arrays cross the host boundary in two places only, both here: ``place`` builds a global array from each process's
own host copy (each process fills only the shards its devices hold: no weights travel between hosts), ``fetch``
gathers one to every process. Every process must hold the same host values (same seed, same prompt: the torch CPU
generator, the host text encoder and the scheduler are deterministic); an input computed on the host enters the
compiled programs through ``jax.device_put``, which verifies that across processes (a clear error, not a mixed
array).
"""

from __future__ import annotations

import os

import jax
import numpy as np

COORDINATOR_ENV = "DIFFUSERS_TPU_COORDINATOR"
NUM_PROCESSES_ENV = "DIFFUSERS_TPU_NUM_PROCESSES"
PROCESS_ID_ENV = "DIFFUSERS_TPU_PROCESS_ID"
SWITCH_ENV = "DIFFUSERS_TPU_DISTRIBUTED"

_initialized_here = False


def _int_env(name: str) -> int:
    value = os.environ.get(name, "")
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{name}={value!r} must be an integer (set it with {COORDINATOR_ENV} for a multi-process "
                         "run, before `import diffusers_tpu`).") from None


def _multi_host_tpu_slice() -> bool:
    """A Cloud TPU slice of several hosts: the worker list in the environment (GKE) or, on a TPU VM (TPU device
    files present), in the VM's metadata, as JAX's own cluster detection reads it."""
    import glob

    hosts = os.environ.get("TPU_PROCESS_ADDRESSES") or os.environ.get("TPU_WORKER_HOSTNAMES")
    if hosts:
        return len([h for h in hosts.split(",") if h.strip()]) > 1
    if not (glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*")):
        return False
    try:
        from jax._src.clusters import cloud_tpu_cluster

        endpoints, code = cloud_tpu_cluster.get_metadata("worker-network-endpoints")
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
            raise ValueError(f"{COORDINATOR_ENV}={coordinator!r} must be host:port, e.g. 10.0.0.2:8476 (process 0's "
                             "address, reachable from every process).")
        kwargs = dict(coordinator_address=coordinator, num_processes=num_processes, process_id=process_id)
    elif switch == "1" or _multi_host_tpu_slice():
        kwargs = {}  # JAX detects the cluster (Cloud TPU, SLURM, Open MPI, Kubernetes)
    else:
        return False
    # CPU processes exchange collectives over gloo (the default has none across processes); harmless elsewhere.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    try:
        jax.distributed.initialize(**kwargs)
    except (RuntimeError, ValueError) as error:
        arguments = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
        raise RuntimeError(
            f"jax.distributed.initialize({arguments}) failed: {str(error).rstrip('.')}. It "
            f"must run before anything uses JAX (import diffusers_tpu first), with {COORDINATOR_ENV}, "
            f"{NUM_PROCESSES_ENV} and {PROCESS_ID_ENV} set for every process, or on a multi-host TPU slice; "
            f"{SWITCH_ENV}=0 runs this process alone."
        ) from error
    _initialized_here = True
    return True


def is_multi_process() -> bool:
    return jax.process_count() > 1


def is_main_process() -> bool:
    """Process 0: the one that writes files and prints reports."""
    return jax.process_index() == 0


def place(array, sharding) -> jax.Array:
    """A host array (numpy) as a global device array: each process fills only the shards its own devices hold, from
    its own copy (weights: nothing crosses hosts). A JAX array computed on this process (a pipeline input) is placed
    by ``jax.device_put``, which checks that every process holds the same value."""
    if sharding.is_fully_addressable:
        return jax.device_put(array, sharding)
    if isinstance(array, jax.Array):
        try:
            return jax.device_put(array, sharding)
        except AssertionError as error:
            raise RuntimeError(
                "The processes disagree on a pipeline input: every process must run the same script with the same "
                "inputs (same prompt, seed and generator; a torch CPU generator seeded alike on every host gives the "
                "same latents)."
            ) from error
    return jax.make_array_from_callback(array.shape, sharding, lambda index: array[index])


def fetch(array: jax.Array) -> np.ndarray:
    """A (global) device array as a host array on every process."""
    if array.is_fully_addressable:
        return np.asarray(array)
    if array.sharding.is_fully_replicated:  # every process holds it all already
        return np.asarray(array.addressable_data(0))
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(array, tiled=True))
