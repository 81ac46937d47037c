"""Each private name of a dependency the project uses, through its one door, still does what the project reads it
for: these fail when a release of the dependency changes one (``interop.jax_private``)."""

import gc
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from diffusers_tpu.interop import jax_private


def test_jax_trace_state_is_clean_outside_a_trace_only():
    seen = []
    jax.jit(lambda x: seen.append(jax_private.trace_state_clean()) or x)(jnp.ones(2))
    assert jax_private.trace_state_clean() is True and seen == [False]


_INDIVISIBLE = """
import jax, jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec
from diffusers_tpu.interop import jax_private
mesh = jax.make_mesh((2,), ("x",))
try:
    jax.jit(lambda x: x, out_shardings=NamedSharding(mesh, PartitionSpec("x")))(jnp.ones(3))
except jax_private.indivisible_error() as error:
    print("caught", type(error).__name__)
devices = jax.devices()[::-1]
mesh = jax.sharding.Mesh(devices, ("x",))
sharded = jax.device_put(jnp.ones(8), NamedSharding(mesh, PartitionSpec("x")))
print(jax_private.lowered_devices(jax.jit(lambda x: x * 2).lower(sharded)) == devices)
"""


def test_jax_indivisible_error_and_lowered_devices_on_two_devices():
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2", "JAX_PLATFORMS": "cpu"}
    result = subprocess.run([sys.executable, "-c", _INDIVISIBLE], capture_output=True, text=True, env=env, timeout=120)
    assert result.stdout.split() == ["caught", "IndivisibleError", "True"], result.stderr[-2000:]


def test_jax_distributed_client_is_none_before_initialize():
    assert jax_private.distributed_client() is None  # a single process here; the pod test connects one


def test_jax_cloud_tpu_metadata_reader_exists():
    from jax._src.clusters import cloud_tpu_cluster  # not called: it would query a metadata server

    assert callable(cloud_tpu_cluster.get_metadata)


def test_jax_hardware_utils_counts_no_tpu_chip_here():
    assert jax_private.hardware_utils_path().endswith("hardware_utils.py")
    assert jax_private.tpu_chips() == 0


def test_jax_backends_initialized_after_a_device_query():
    jax.devices()
    assert jax_private.backends_initialized() is True


def test_jax_lowered_devices_are_the_input_mesh_in_order():
    devices = jax.devices()[::-1][: max(1, min(4, jax.device_count()))]
    mesh = jax.sharding.Mesh(np.array(devices), ("x",))
    sharded = jax.device_put(jnp.ones(8), NamedSharding(mesh, PartitionSpec("x")))
    lowered = jax.jit(lambda x: x * 2).lower(sharded)
    assert jax_private.lowered_devices(lowered) == devices


def test_jax_adds_the_gc_callback_interrupts_watches():
    jnp.ones(2).block_until_ready()
    assert jax_private.GC_CALLBACK in {getattr(c, "__name__", "") for c in gc.callbacks}
