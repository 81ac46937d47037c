"""``enable_sequential_cpu_offload(device="tpu" | "jax")``: diffusers' sequential offload on JAX
(``runtime.sequential_offload``, ``runtime.host_memory``): weights stored in host memory and moved to the devices where
programs read them (the repeated blocks layer by layer inside the loop), stock's observable state (accelerate's
``AlignDevicesHook``, ``meta`` parameters between calls), outputs equal to the un-offloaded run's, no recompilation.
The 8-device mesh: ``test_mesh.test_sequential_offload_on_the_mesh``."""

import re

import accelerate
import numpy as np
import pytest
import torch

from diffusers_tpu import TPUConfig
from diffusers_tpu.interop import compile_accounting, sharding
from diffusers_tpu.planner import hlo_stats, plan, tpu_compiler
from diffusers_tpu.runtime.attach import pipeline_runtime
from diffusers_tpu.runtime.weights import stacked_weights
from diffusers_tpu.testing import tiny, tiny_parts, tiny_unet
from tests.conftest import generate


def run(pipe):
    return generate(pipe, output_type="np", num_inference_steps=2)


def modules(pipe):
    return {n: m for n, m in pipe.components.items() if isinstance(m, torch.nn.Module)}


def four_block_wan():
    pipe = tiny.wan_pipeline("wan")
    pipe.transformer = tiny_parts.rebuilt(0, pipe.transformer, num_layers=4)  # blocks 1..3 in the loop
    return pipe


def test_weights_stream_from_host_memory_and_the_video_is_stock():
    pipe = four_block_wan()
    reference = run(pipe)
    pipe.to("jax")
    pipe.enable_sequential_cpu_offload(device="jax")  # a moved pipeline moves again, its weights in host memory
    runtime = pipeline_runtime.runtime_of(pipe)
    assert runtime.config.weights_in_host_memory and pipe._execution_device.type == "jax"
    assert all(m.device.type == "meta" for m in modules(pipe).values())  # as stock shows them between calls
    assert all(isinstance(m._hf_hook, accelerate.hooks.AlignDevicesHook) for m in modules(pipe).values())
    np.testing.assert_allclose(run(pipe), reference, atol=1e-4)
    assert all(m.device.type == "meta" for m in modules(pipe).values())
    with compile_accounting.compile_log() as log:
        np.testing.assert_allclose(run(pipe), reference, atol=1e-4)
    assert log.compilations == 0
    pipe.remove_all_hooks()  # the modules hold their weights again, still in host memory
    layer = pipe.transformer.blocks[2].attn1.to_q._parameters["weight"]
    assert stacked_weights.is_view(layer) and layer.stack.array.sharding.memory_kind == "pinned_host"
    vae_weight = pipe.vae.post_quant_conv.weight
    assert sharding.sharding_of(vae_weight).memory_kind == "device"  # read outside a program: moved for that use
    np.testing.assert_allclose(run(pipe), reference, atol=1e-4)
    pipe.to("cpu")
    assert all(type(p) is torch.nn.Parameter for p in pipe.transformer.parameters())
    np.testing.assert_array_equal(run(pipe), reference)


def test_twice_without_a_device_then_back_to_torch_on_a_unet_pipeline():
    """Stock's ``test_sequential_offload_forward_pass_twice`` on a UNet pipeline, whose VAE runs convolutions
    outside its compiled parts (they read host-stored weights on the devices), and ``pipe.to("cpu")`` after it."""
    pipe, call = tiny_unet.pipeline("sd")
    call = dict(call, output_type="np")
    expected = pipe(**call, generator=torch.Generator().manual_seed(0)).images
    pipe.enable_sequential_cpu_offload()  # no device and no accelerator: JAX's (stock would raise)
    first = pipe(**call, generator=torch.Generator().manual_seed(0)).images
    pipe.enable_sequential_cpu_offload()
    second = pipe(**call, generator=torch.Generator().manual_seed(0)).images
    np.testing.assert_allclose(first, expected, atol=1e-4)
    np.testing.assert_array_equal(first, second)
    assert pipe.unet.device.type == "meta" and pipe.text_encoder.device.type == "meta"
    encoded = pipe.encode_prompt("a cat", "cpu", 1, False)[0]  # an entry point outside a call sees its weights
    assert encoded.device.type == "cpu" and pipe.text_encoder.device.type == "meta"
    pipe.to("cpu")
    assert not any(hasattr(m, "_hf_hook") for m in modules(pipe).values())
    # (any JAX round trip of this pipeline, offloaded or not, leaves stock's next image 1.8e-7 off: not the weights)
    np.testing.assert_allclose(pipe(**call, generator=torch.Generator().manual_seed(0)).images, expected, atol=1e-4)


def test_weights_in_host_memory_rejects_what_it_cannot_combine_with():
    with pytest.raises(ValueError, match="does not combine with fully_sharded_weights or quantize"):
        TPUConfig(weights_in_host_memory=True, quantize="int8")
    with pytest.raises(ValueError, match="must be a bool"):
        TPUConfig(weights_in_host_memory="yes")


@pytest.mark.skipif(not tpu_compiler.available(), reason="libtpu (the TPU compiler) not installed")
def test_the_tpu_step_streams_each_layer_from_host_memory():
    """TPU-compiled (v6e-4, tp4, bfloat16): the step's weights enter in host memory (memory space 5), the layer loop
    slices each layer out of host memory (``dynamic-slice-start`` of an S(5) operand), and the device arguments shrink.
    (A bfloat16 ``[L, D]`` stack sliced out of host memory does not compile: per-layer vectors stay on the devices.)"""
    pipe = tiny.wan_pipeline("wan-4head")
    size = dict(height=32, width=32, num_frames=5, guidance_scale=5.0)
    devices = tpu_compiler.devices("v6e-4")
    found = {}
    for host in (False, True):
        config = TPUConfig(
            compile_cache_dir=False,
            weights_in_host_memory=host,
            mesh={"dp": 1, "sp": 1, "tp": 4},
            dtype=torch.bfloat16,
        )

        def analyse(lowered, host=host):
            compiled = lowered.compile()
            found[host] = (compiled.as_text(), compiled.memory_analysis().argument_size_in_bytes)
            return hlo_stats.summary(compiled)

        plan.start_denoiser_memory(pipe, size, config, devices, 16, analyse=analyse, vae=False)()
    text, host_arguments = found[True]
    spaces = re.search(r'arg_memory_spaces="([0-9;]+)"', text).group(1).split(";")
    assert spaces.count("5") >= 25  # the weights (latents, timestep, text and the blocks' vectors: device memory)
    streamed = [line for line in text.splitlines() if "dynamic-slice-start(" in line and "S(5)}" in line]
    assert streamed
    assert host_arguments < found[False][1] / 4
    assert "S(5)" not in found[False][0]
