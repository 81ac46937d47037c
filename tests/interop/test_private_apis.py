"""Each private name of a dependency the project uses, through its one door, still does what the project reads it
for: these fail when a release of the dependency changes one (``interop.jax_private``, ``interop.torch_private``,
``interop.torchax_private``)."""

import gc
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
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


def test_torch_pytree_flattens_what_the_project_passes():
    import torch

    from diffusers_tpu.interop.torch_private import pytree

    tree = {"a": [torch.ones(1), (2, torch.zeros(2))]}
    leaves, spec = pytree.tree_flatten(tree)
    assert len(leaves) == 3 and pytree.tree_unflatten(leaves, spec)["a"][1][0] == 2
    assert pytree.tree_map_only(torch.Tensor, lambda t: t + 1, tree)["a"][1][1].tolist() == [1.0, 1.0]


def test_torch_pytree_node_registered_then_deregistered():
    class Pair:
        def __init__(self, a, b):
            self.a, self.b = a, b

    from diffusers_tpu.interop import torch_private

    torch_private.pytree.register_pytree_node(Pair, lambda p: ((p.a, p.b), None), lambda c, _: Pair(*c))
    assert len(torch_private.pytree.tree_leaves(Pair(1, 2))) == 2
    torch_private.deregister(Pair)
    assert torch_private.pytree.tree_leaves(Pair(1, 2))[0].__class__ is Pair  # a leaf again
    torch_private.deregister(Pair)  # twice: nothing to do


def test_torch_op_types_and_scalar_reads_are_recognised():
    import torch

    from diffusers_tpu.interop import torch_private

    assert isinstance(torch.ops.aten.add.Tensor, torch_private.OpOverload)
    assert isinstance(torch.ops.aten.add, torch_private.OpOverloadPacket)
    assert isinstance(torch.ops.aten, torch_private.OpNamespace)
    seen = []

    class Spy(torch.Tensor):
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            seen.append(func in torch_private.TENSOR_TO_PYTHON)
            return super().__torch_function__(func, types, args, kwargs or {})

    float(torch.tensor(2.0).as_subclass(Spy))
    assert True in seen


def test_torch_plain_inside_a_dispatch_mode_and_modes_listed():
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from diffusers_tpu.interop import torch_private

    class Counting(TorchDispatchMode):
        calls = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Counting.calls += 1
            return func(*args, **(kwargs or {}))

    with Counting() as mode:
        assert mode in torch_private.dispatch_modes()
        torch.ones(2) + 1
        counted = Counting.calls
        with torch_private.plain_torch():
            torch.ones(2) + 1
        assert Counting.calls == counted > 0


def test_torch_reparametrized_swaps_weights_for_the_duration():
    import torch

    from diffusers_tpu.interop import torch_private

    linear = torch.nn.Linear(2, 1, bias=False)
    with torch_private.reparametrized(linear, {"weight": torch.ones(1, 2)}):
        assert linear(torch.ones(2)).item() == 2.0
    assert not torch.equal(linear.weight, torch.ones(1, 2))
    assert torch_private.private_use1() is torch._C._autograd.DeviceType.PrivateUse1  # named "JAX" once torchax loads


def test_torchax_tensor_internals_read_and_write():
    import torch
    import torchax

    from diffusers_tpu.interop import torchax_private

    env = torchax.default_env()
    with env:
        tensor = torch.ones(3, device="jax")
    assert torchax_private.holds_array(tensor) and not torchax_private.holds_array(torch.ones(1))
    assert isinstance(torchax_private.array(tensor), jax.Array) and torchax_private.array(torch.ones(1)) is None
    assert torchax_private.environment_of(tensor) is env
    torchax_private.set_array(tensor, jnp.full(3, 7.0))
    assert tensor.jax().tolist() == [7.0, 7.0, 7.0]
    seen = []
    jax.jit(lambda x: seen.append(torchax_private.holds_tracer(torchax.tensor.Tensor(x, env))) or x)(jnp.ones(1))
    assert seen == [True] and not torchax_private.holds_tracer(tensor)


def test_torchax_environment_internals():
    import torch
    import torch.nn.functional as F
    import torchax

    from diffusers_tpu.interop import torch_private, torchax_private

    env = torchax.default_env()
    assert F.scaled_dot_product_attention in torchax_private.op_table(env)
    assert torchax_private.op_or_decomposition(env, torch.ops.aten.add.Tensor) is not None
    assert torchax_private.routes_to_jax(env, "jax") and not torchax_private.routes_to_jax(env, "cpu")
    with env:
        assert torchax_private.dispatch_mode(env) in torch_private.dispatch_modes()


def test_jax_quick_compile_is_accepted_and_is_effort_minus_one_where_that_exists():
    """The quick VAE/screening compile option: accepted by the installed jax's TPU compiler; where jax still takes
    ``exec_time_optimization_effort=-1`` (0.10), the two build the same program."""
    from diffusers_tpu.planner import tpu_compiler

    if not tpu_compiler.usable():
        pytest.skip("libtpu (the TPU compiler) not usable here")
    device = tpu_compiler._devices("v6e:1x1")[0]
    sharding = jax.sharding.SingleDeviceSharding(device)
    spec = jax.ShapeDtypeStruct((256, 256), jnp.float32, sharding=sharding)
    lowered = jax.jit(lambda a, b: jnp.tanh(a @ b) @ b).lower(spec, spec)
    quick = lowered.compile(jax_private.QUICK_COMPILE).as_text()
    try:
        legacy = lowered.compile({"exec_time_optimization_effort": -1.0}).as_text()
    except Exception as error:  # noqa: BLE001 - jax 0.12 refuses the old name
        assert "exec_time_optimization_effort" in str(error)
        return
    assert quick == legacy
