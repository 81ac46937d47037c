"""Repeated blocks' weights stored stacked (``runtime.stacked_weights``): one array per weight of a block list, the
step's loop indexes it; the module keeps its stock parameters as views, and nothing is stored twice."""

import jax
import numpy as np
import pytest
import torch

from diffusers_tpu import TPUConfig
from diffusers_tpu.interop import compile_accounting, program_figures, sharding
from diffusers_tpu.planner import hlo_stats, tpu_compiler
from diffusers_tpu.runtime.weights import stacked_weights
from diffusers_tpu.testing import tiny
from tests.conftest import assert_np_matches

CALL = dict(
    prompt="a cat walks on the grass",
    negative_prompt="blurry",
    height=32,
    width=32,
    num_frames=9,
    num_inference_steps=2,
    max_sequence_length=24,
    output_type="np",
)


def run(pipe, **overrides):
    return pipe(**dict(CALL, **overrides), generator=torch.Generator().manual_seed(0)).frames


def test_blocks_are_stacked_once_and_the_video_is_stock():
    ref, pipe = tiny.wan_pipeline("wan-4head"), tiny.wan_pipeline("wan-4head")
    expected = run(ref)
    pipe.to("jax")
    blocks = pipe.transformer.blocks
    view = blocks[1].attn1.to_q.weight
    assert stacked_weights.is_view(view) and view.stack is blocks[2].attn1.to_q.weight.stack
    assert view.stack.array.shape == (3, *view.shape)
    # every placed weight of the transformer is stored once: the stacks replace the layers' own arrays
    slots = sharding.slots_of(pipe.transformer)
    expected_bytes = sum(
        np.prod(sharding.tensor_of(s).shape, dtype=int) * torch.empty((), dtype=s.dtype).element_size() for s in slots
    )
    stored = {id(s.stack[0]): s.stack[0].array.nbytes for s in sharding.slots_of(pipe.transformer) if s.stack}
    plain = sum(sharding.tensor_of(s).jax().nbytes for s in sharding.slots_of(pipe.transformer) if not s.stack)
    assert sum(stored.values()) + plain == expected_bytes and len(stored) >= 20
    assert_np_matches(run(pipe), expected)
    with compile_accounting.compile_log() as log:
        run(pipe)
    assert log.compilations == 0
    # state_dict reads each layer out of its stack; the way back to torch is exact
    state = pipe.transformer.state_dict()
    theirs = ref.transformer.state_dict()
    assert all(torch.equal(value, theirs[key]) for key, value in state.items())
    pipe.to("cpu")
    assert not stacked_weights.is_view(pipe.transformer.blocks[1].attn1.to_q.weight)
    assert all(torch.equal(value, theirs[key]) for key, value in pipe.transformer.state_dict().items())


def test_an_in_place_write_to_a_layer_lands_in_its_stack():
    ref, pipe = tiny.wan_pipeline("wan-4head"), tiny.wan_pipeline("wan-4head")
    with torch.no_grad():
        ref.transformer.blocks[2].ffn.net[2].weight.mul_(0.5)
    expected = run(ref)
    pipe.to("jax")
    weight = pipe.transformer.blocks[2].ffn.net[2].weight
    with torch.no_grad(), pipe._diffusers_tpu_runtime.call_scope():
        weight.mul_(0.5)  # through torchax: the view's value is written back into the stack
    assert stacked_weights.is_view(pipe.transformer.blocks[2].ffn.net[2].weight)
    assert_np_matches(run(pipe), expected)


def _loop_counts(hlo_text):
    found = hlo_stats.stats(hlo_text)
    loop = found.largest_loop()
    return found, loop


def compiled_step_text(pipe) -> str:
    """The CPU-compiled HLO of the denoiser step a call of ``pipe`` runs (its arguments recorded from the call)."""
    entry = pipe._diffusers_tpu_runtime.denoisers["transformer"]
    captured, whole = {}, entry.whole

    def recorded(*args, **kwargs):
        captured.setdefault("call", (args, kwargs))
        return whole(*args, **kwargs)

    entry.whole = recorded
    try:
        run(pipe)
    finally:
        entry.whole = whole
    args, kwargs = captured["call"]
    return program_figures.lower(whole, *args, **kwargs).compile().as_text()


def test_the_compiled_loop_indexes_stacks_without_a_switch():
    """CPU-compiled: the step's layer loop holds no conditional (the former per-layer ``lax.switch``); with
    ``scan_blocks=False`` nothing is stacked and the blocks are unrolled."""
    pipe = tiny.wan_pipeline("wan-4head")
    pipe.to("jax")
    text = compiled_step_text(pipe)
    found, loop = _loop_counts(text)
    assert loop is not None and loop.trip_count == 3  # all 3 blocks: block 0 joins the loop
    # (the only conditionals left are the interpret-mode attention kernel's own)
    assert not [line for line in text.splitlines() if " conditional(" in line and "attention" not in line]
    pipe.to("cpu")
    pipe.to("jax", config=TPUConfig(scan_blocks=False))
    assert not stacked_weights.is_view(pipe.transformer.blocks[1].attn1.to_q.weight)


@pytest.mark.tpu_slow  # a real-size TPU compile (~40 s): CI's second command
@pytest.mark.skipif(not tpu_compiler.available(), reason="libtpu (the TPU compiler) not installed")
def test_wan_1_3b_step_compiles_lean_for_tpu():
    """The issue's bar, on the TPU-compiled Wan2.1-1.3B 480p x 81 step (v6e 2x2, dp2·sp1·tp2, all 30 blocks): at most
    24 copies and 10 non-attention custom calls in the layer loop, at most 14 MB of generated code (were 799 copies,
    73 custom calls and 163 MB with the per-layer switch and the pad-with-interior rotary write; 41 copies and 12.5
    MB before the rotary kernel; 20 and 11.5 MB with it)."""
    from diffusers_tpu.planner import architectures, plan

    pipe = architectures.build("Wan2.1-1.3B", torch.bfloat16, weights=False)
    size = dict(height=480, width=832, num_frames=81, guidance_scale=5.0)

    def analyse(lowered):
        return hlo_stats.summary(lowered.compile())

    config = TPUConfig(dtype=torch.bfloat16, mesh={"dp": 2, "sp": 1, "tp": 2}, compile_cache_dir=False)
    report = plan.start_denoiser_memory(pipe, size, config, tpu_compiler.devices("v6e-4"), 512, analyse=analyse)()
    step = report["passes"][0]
    loop = max(step["hlo"]["loops"], key=lambda loop: loop["instructions"])
    assert loop["trip_count"] == 30  # every block in the loop, block 0 included
    non_attention = sum(n for target, n in loop["custom_calls"].items() if target != "tpu_custom_call")
    assert loop["copies"] <= 24 and non_attention <= 10, loop
    assert step["generated_code_bytes"] <= 14e6
    assert np.isclose(step["hlo"]["total"]["flops"], 4.105e13, rtol=0.01)  # non-attention FLOPs per chip (analytic)


def test_fully_sharded_spec_takes_the_axes_a_layer_leaves_unused():
    from types import SimpleNamespace

    from jax.sharding import PartitionSpec as P

    mesh = SimpleNamespace(shape={"dp": 2, "sp": 2, "tp": 2})
    assert stacked_weights.fully_sharded(P("tp", None), (64, 32), mesh) == P("tp", ("dp", "sp"))
    assert stacked_weights.fully_sharded(P(), (48,), mesh) == P(("dp", "sp", "tp"))
    # no unsharded dimension the free axes divide: onto the sharded one, if its size allows
    assert stacked_weights.fully_sharded(P("tp", None), (64, 6), mesh) == P(("tp", "dp", "sp"), None)
    assert stacked_weights.fully_sharded(P("tp", None), (6, 6), mesh) == P("tp", None)  # nothing divides: as is
    assert stacked_weights.fully_sharded(P("tp"), (64,), SimpleNamespace(shape={"dp": 1, "sp": 1, "tp": 2})) == P("tp")


@pytest.mark.skipif(not tpu_compiler.available(), reason="libtpu (the TPU compiler) not installed")
def test_fully_sharded_weights_divide_the_step_arguments_on_tpu():
    """Compiled for v6e 2x2 (dp2·tp2): the stacked weights take half the bytes per device or less (the
    other weights shrink too) (the compiled step's
    arguments shrink), and the layer loop gathers each layer's weights (all-gathers in its body)."""
    from diffusers_tpu.interop.backend import Target, build_mesh
    from diffusers_tpu.interop.weights import Gathered, Stacked
    from diffusers_tpu.planner import abstract_weights, plan
    from diffusers_tpu.runtime import decision

    pipe = tiny.wan_pipeline("wan-4head")
    size = dict(height=32, width=32, num_frames=9, guidance_scale=5.0)
    devices = tpu_compiler.devices("v6e-4")
    mesh = build_mesh({"dp": 2, "sp": 1, "tp": 2}, devices)

    def per_device_bytes(full, kinds):
        config = TPUConfig(mesh=dict(mesh.shape), fully_sharded_weights=full)
        denoiser = decision.decide(pipe, config, Target("tpu", "tpu"), devices, memory_limit=None).component(
            "transformer"
        )
        state = abstract_weights.abstract_component(denoiser, mesh, config)
        arrays = [v.array if isinstance(v, (Stacked, Gathered)) else v for v in state.values() if isinstance(v, kinds)]
        return sum(np.prod(a.sharding.shard_shape(a.shape)) * a.dtype.itemsize for a in arrays)

    def stacked_bytes(full):
        return per_device_bytes(full, Stacked)

    def weight_bytes(full):
        return per_device_bytes(full, object)

    found = {}
    for full in (False, True):
        config = TPUConfig(mesh={"dp": 2, "sp": 1, "tp": 2}, compile_cache_dir=False, fully_sharded_weights=full)
        report = plan.start_denoiser_memory(
            pipe, size, config, devices, 24, analyse=lambda lowered: hlo_stats.summary(lowered.compile())
        )()
        step = report["passes"][0]
        found[full] = (step["argument_bytes"], max(step["hlo"]["loops"], key=lambda loop: loop["instructions"]))
    (rules_bytes, rules_loop), (full_bytes, full_loop) = found[False], found[True]
    # at least halved: tp-sharded weights split over dp as well, replicated ones (norms) over dp and tp
    assert 0 < stacked_bytes(True) * 2 <= stacked_bytes(False)
    assert 0 < weight_bytes(True) * 2 <= weight_bytes(False)
    # the compiled step's arguments shrink (not by exactly the logical bytes: the TPU pads small dimensions to tiles)
    assert full_bytes < rules_bytes
    assert full_loop["collectives"].get("all-gather", 0) > rules_loop["collectives"].get("all-gather", 0)


def test_bfloat16_weights_stay_per_layer_on_the_cpu():
    """XLA:CPU computes bfloat16 in float32 and converts a loop-carried bfloat16 stack whole (a float32 copy of
    every layer, twice the weights in temporaries: ``plan``'s CPU estimates doubled): on CPU devices 16-bit float
    weights are not stacked, and the compiled loop carries no float32 copy of them; float32 weights still stack."""
    import re

    pipe = tiny.wan_pipeline("wan-4head")
    pipe.to("jax", config=TPUConfig(dtype=torch.bfloat16))
    text = compiled_step_text(pipe)
    assert not stacked_weights.is_view(pipe.transformer.blocks[1].attn1.to_q.weight)
    stacks = {id(s.stack[0]): s.stack[0] for s in sharding.slots_of(pipe.transformer) if s.stack}
    assert all(stack.array.dtype == jax.numpy.float32 for stack in stacks.values())
    layers = len(pipe.transformer.blocks)
    states = [line.split(" while(")[0] for line in text.splitlines() if " while(" in line]
    carried_f32 = max(len(re.findall(rf"\bf32\[{layers},", state)) for state in states)
    assert carried_f32 <= len(stacks), "bfloat16 weights are carried through the layer loop as float32"


def test_fully_sharded_weights_rejects_nonsense_and_its_fix_works():
    with pytest.raises(ValueError, match="fully_sharded_weights='yes'"):
        TPUConfig(fully_sharded_weights="yes")
    with pytest.raises(ValueError, match="needs scan_blocks=True .* drop scan_blocks=False"):
        TPUConfig(fully_sharded_weights=True, scan_blocks=False)
    assert TPUConfig(fully_sharded_weights=True).scan_blocks  # the fix the message names
