"""``enable_model_cpu_offload(device="tpu" | "jax")``: diffusers' model offload on JAX (``runtime.model_offload``):
weights on the host between uses, each component placed when it runs, outputs equal to the un-offloaded run's, no
recompilation. The 8-device mesh: ``test_mesh.test_model_offload_on_the_mesh``."""

import accelerate
import numpy as np
import torch

from diffusers_tpu import TPUConfig
from diffusers_tpu.interop import compile_accounting, sharding
from diffusers_tpu.runtime.attach import pipeline_runtime
from diffusers_tpu.testing import tiny
from tests.conftest import generate


def run(pipe):
    return generate(pipe, output_type="np", num_inference_steps=2)


def modules(pipe):
    return {name: m for name, m in pipe.components.items() if isinstance(m, torch.nn.Module)}


def test_each_component_is_on_the_devices_only_while_it_runs():
    pipe = tiny.wan_pipeline()
    reference = run(pipe)
    placed_while_running = {}
    pipe.transformer.register_forward_pre_hook(
        lambda m, a: placed_while_running.update(
            transformer=sharding.is_placed(pipe.transformer), vae=sharding.is_placed(pipe.vae)
        )
    )
    pipe.enable_model_cpu_offload(device="jax")
    assert pipe._execution_device.type == "jax"
    assert all(m.device.type == "cpu" for m in modules(pipe).values())
    np.testing.assert_allclose(run(pipe), reference, atol=1e-5)
    assert placed_while_running == {"transformer": True, "vae": False}
    assert all(m.device.type == "cpu" for m in modules(pipe).values())  # all back on the host after the call
    assert all(isinstance(m._hf_hook, accelerate.hooks.CpuOffload) for m in modules(pipe).values())
    with compile_accounting.compile_log() as log:
        np.testing.assert_allclose(run(pipe), reference, atol=1e-5)
    assert log.compilations == 0  # the same shapes and shardings come back every call


def test_offload_on_a_moved_int8_pipeline_without_a_device_then_hooks_removed_then_back_to_torch():
    pipe = tiny.wan_pipeline()
    reference = run(pipe)
    pipe.to("jax", config=TPUConfig(quantize="int8"))
    quantized = run(pipe)
    pipe.enable_model_cpu_offload()  # no device: the pipeline's own (stock would find no accelerator here)
    assert pipeline_runtime.runtime_of(pipe).config.quantize == "int8"
    np.testing.assert_array_equal(run(pipe), quantized)
    pipe.remove_all_hooks()  # the weights come back to the devices for good
    np.testing.assert_array_equal(run(pipe), quantized)
    assert sharding.is_placed(pipe.transformer) and not hasattr(pipe.transformer, "_hf_hook")
    pipe.enable_model_cpu_offload(device="tpu")  # any JAX device string: the pipeline's own devices
    pipe.to("cpu")
    assert not any(hasattr(m, "_hf_hook") for m in modules(pipe).values())
    np.testing.assert_array_equal(run(pipe), reference)
