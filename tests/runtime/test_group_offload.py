"""``enable_group_offload(onload_device="tpu" | "jax")``: group offloading on JAX (``runtime.group_offload``):
the components' weights stored in host memory and streamed into the programs, the modules showing their host tensors
between calls, diffusers' own view of it (``_get_top_level_group_offload_hook``, ``_execution_device``), outputs equal
to the un-offloaded run's; onto a torch device it is stock's."""

import numpy as np
import pytest
import torch
from diffusers.hooks import HookRegistry, apply_group_offloading
from diffusers.hooks.group_offloading import (
    _get_top_level_group_offload_hook,
    _maybe_remove_and_reapply_group_offloading,
)

from diffusers_tpu.interop import compile_accounting, sharding
from diffusers_tpu.runtime.attach import pipeline_runtime
from diffusers_tpu.runtime.weights import stacked_weights
from diffusers_tpu.testing import tiny, tiny_parts
from tests.conftest import generate


def run(pipe):
    return generate(pipe, output_type="np", num_inference_steps=2)


def four_block_wan():
    pipe = tiny.wan_pipeline("wan")
    pipe.transformer = tiny_parts.rebuilt(0, pipe.transformer, num_layers=4)  # blocks 1..3 in the loop
    return pipe


def test_components_offloaded_onto_jax_move_their_pipeline_when_it_is_called():
    """diffusers' ``test_group_offloading_inference``: group offloading applied to components of a pipeline that
    is not on JAX (streams asked for: XLA overlaps transfers itself); its call runs on JAX with their weights in
    host memory, and between calls they show the host tensors they had."""
    reference = run(four_block_wan())
    pipe = four_block_wan()
    host_weight = pipe.transformer.blocks[2].attn1.to_q.weight
    pipe.transformer.enable_group_offload("jax", offload_type="block_level", num_blocks_per_group=1, use_stream=True)
    apply_group_offloading(pipe.text_encoder, onload_device=torch.device("jax"), offload_type="leaf_level")
    assert _get_top_level_group_offload_hook(pipe.transformer).config.onload_device.type == "jax"
    assert not pipeline_runtime.is_attached(pipe)
    np.testing.assert_allclose(run(pipe), reference, atol=1e-4)
    runtime = pipeline_runtime.runtime_of(pipe)
    assert runtime.config.weights_in_host_memory == ("text_encoder", "transformer")
    assert pipe._execution_device.type == "jax"
    assert pipe.transformer.blocks[2].attn1.to_q.weight is host_weight  # shown between calls, as stock keeps it
    with runtime.weights_shown():
        layer = pipe.transformer.blocks[2].attn1.to_q._parameters["weight"]
        assert stacked_weights.is_view(layer) and layer.stack.array.sharding.memory_kind == "pinned_host"
    assert sharding.sharding_of(pipe.vae.decoder.conv_in.weight).memory_kind == "device"  # not offloaded
    with compile_accounting.compile_log() as log:
        np.testing.assert_allclose(run(pipe), reference, atol=1e-4)
    assert log.compilations == 0
    _maybe_remove_and_reapply_group_offloading(pipe.transformer)  # what a LoRA change does: no new move
    assert pipeline_runtime.runtime_of(pipe) is runtime
    pipe.to("cpu")
    assert _get_top_level_group_offload_hook(pipe.transformer) is None
    np.testing.assert_array_equal(run(pipe), reference)


def test_pipeline_level_group_offload_moves_at_once_leaving_excluded_components_on_the_devices(monkeypatch):
    monkeypatch.setenv("DIFFUSERS_TPU_PLATFORM", "cpu")  # "tpu" rehearses on this machine
    pipe = four_block_wan()
    reference = run(pipe)
    pipe.to("jax")
    pipe.enable_group_offload(onload_device="tpu", offload_type="leaf_level", exclude_modules="vae")
    runtime = pipeline_runtime.runtime_of(pipe)
    assert runtime.target.requested == "jax"  # the devices it was moved to
    assert runtime.config.weights_in_host_memory == ("text_encoder", "transformer")
    assert next(pipe.transformer.parameters()).device.type == "cpu" and pipe.vae.device.type == "jax"
    assert pipe.transformer.device.type == "jax"  # diffusers reports a group-offloaded model's onload device
    np.testing.assert_allclose(run(pipe), reference, atol=1e-4)
    fresh = four_block_wan()
    fresh.enable_group_offload(onload_device="tpu", offload_type="block_level", num_blocks_per_group=2)
    assert pipeline_runtime.runtime_of(fresh).target.requested == "tpu"
    np.testing.assert_allclose(run(fresh), reference, atol=1e-4)
    pipe.to("cpu")
    fresh.to("cpu")


def test_group_offload_onto_the_cpu_is_stock():
    pipe = tiny.wan_pipeline("wan")
    pipe.transformer.enable_group_offload("cpu", offload_type="block_level", num_blocks_per_group=1)
    assert HookRegistry.check_if_exists_or_initialize(pipe.transformer).get_hook("group_offloading") is not None
    assert type(_get_top_level_group_offload_hook(pipe.transformer)).__name__ == "GroupOffloadingHook"
    with pytest.raises(ValueError, match="group_offloading"):  # stock's hooks cannot move with it
        pipe.to("jax")
