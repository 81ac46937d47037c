"""planner/llo.py (reading Mosaic's LLO dump), planner/kernel_work.py (the exp2 and splash kernels' work per tile)."""

import dataclasses

import pytest

from diffusers_tpu.planner import kernel_work, llo, tpu_compiler

needs_libtpu = pytest.mark.skipif(not tpu_compiler.available(), reason="libtpu (the TPU compiler) not installed")

# A grid of (2 heads, 3 kv blocks): init on the first kv block, a 4-trip loop whose last two trips select,
# a branch read from memory, finish on the last kv block. Shaped like Mosaic's post-finalize-llo text.
DUMP = """module attributes {stable_mosaic.version = 15 : i64} {
  func.func @toy(%arg0: i32 {llo.type = i32}, %arg1: i32, %arg2: i32) attributes {iteration_bounds = array<i64: 2, 3>} {
    %0 = llo.constant {value = 0 : i32} : i32
    %1 = llo.constant {value = 4 : i32} : i32
    %2 = llo.constant {value = 1 : i32} : i32
    %3 = llo.constant {value = 2 : i32} : i32
    %4 = llo.constant {value = dense<0.000000e+00> : vector<8x128xf32>} : vector<8x128xf32>
    %5 = llo.seq.s32 %arg1, %0
    scf.if %5 {
      llo.vector_store %4 into %arg2 : vector<8x128xf32> into i32
    } {in_layout = []}
    scf.for %arg3 = %0 to %1 step %2  : i32 {
      %6 = llo.vector_load %arg2 : i32 -> vector<8x128xf32>
      %7 = "llo.vmatres"() <{mxu_id = 0 : i32}> : () -> vector<8x128xf32>
      %8 = llo.vpow2.f32 %7 : vector<8x128xf32>
      %9 = llo.slt.s32 %arg3, %1
      %10 = llo.sgt.s32 %arg3, %2
      %11 = llo.pand %9, %10
      scf.if %11 {
        %12 = llo.vselect %11, %8, %4 : (vector<8x128xi1>, vector<8x128xf32>, vector<8x128xf32>) -> vector<8x128xf32>
      } else {
        %12 = llo.vadd.f32 %8, %4 : vector<8x128xf32>
        %13 = llo.vadd.f32 %12, %4 : vector<8x128xf32>
      } {in_layout = []}
    } {in_layout = []}
    %14 = llo.sld %arg2 : i32 -> i32
    scf.if %14 {
      %15 = llo.vxpose %4 : vector<8x128xf32>
    } {in_layout = []}
    %16 = llo.seq.s32 %arg1, %3
    scf.if %16 {
      %17 = llo.vrecip.f32 %4 : vector<8x128xf32>
    } {in_layout = []}
    return {in_layout = []}
  }
  func.func @transform_0(%arg0: i32) -> (i32, i32) {
    return %arg0, %arg0 : i32, i32
  }
}
"""


def test_ops_are_counted_over_the_grid_with_branches_and_trip_counts_evaluated():
    (kernel,) = llo.parse(DUMP)  # transform functions have no grid: not kernels
    assert (kernel.name, kernel.grid) == ("toy", (2, 3))
    work = llo.work(kernel)
    steps = 6
    assert work.steps == steps
    # per step: 4 loop trips of load + matmul pop + exp2; trips 0 and 1 take the else (2 adds), 2 and 3 the select
    assert work.ops["llo.vector_load"] == 4 * steps and work.ops["llo.vpow2.f32"] == 4 * steps
    assert work.ops["llo.vselect"] == 2 * steps and work.ops["llo.vadd.f32"] == 4 * steps
    assert work.ops["llo.vector_store"] == 2  # init: the first kv block of each head
    assert work.ops["llo.vrecip.f32"] == 2  # finish: the last kv block of each head
    assert work.ops["llo.vxpose"] == steps and work.assumed_taken == steps  # read from memory: taken, and said so
    units = work.by_unit()
    assert units == {
        "mxu": 4 * steps,
        "vector": 6 * steps,
        "transcendental": 4 * steps + 2,
        "load/store": 5 * steps + 2,  # the loads, the sld and the init stores
        "cross-lane": steps,
        "scalar": steps * (2 + 4 * 2),  # the two seq and each trip's slt/sgt (sld is a load; pand a predicate)
    }


def test_units_of_llo_ops():
    assert llo.unit_of("llo.vmatmul.mubr") == llo.unit_of("llo.vlatchi") == "mxu"
    assert llo.unit_of("llo.vpow2.f32") == llo.unit_of("llo.vexp.f32") == "transcendental"
    assert llo.unit_of("llo.vmax.xlane.f32") == llo.unit_of("llo.vxpose") == "cross-lane"
    assert llo.unit_of("llo.vmax.f32") == llo.unit_of("llo.vselect") == "vector"
    assert llo.unit_of("llo.vector_load") == llo.unit_of("llo.sld") == "load/store"
    assert llo.unit_of("llo.constant") is llo.unit_of("llo.vbitcast") is None


def test_long_grid_axes_are_sampled_with_exact_weights():
    samples = llo._axis_samples(1000)
    assert sum(weight for _, weight in samples) == 1000
    assert {i for i, _ in samples} >= {0, 7, 992, 999}
    assert llo._axis_samples(5) == [(i, 1) for i in range(5)]


def test_unknown_kernel_is_refused_before_any_compile():
    with pytest.raises(ValueError, match="Unknown kernel 'flash3'"):
        kernel_work.count([("flash3", kernel_work.AttentionCall(1, 1, 256, 256, 128), "v6e-1")])


@pytest.mark.slow
@needs_libtpu
def test_exp2_issues_no_more_vector_or_transcendental_work_than_splash():
    """At a real-size unmasked call (the Wan 1.3B self-attention, padded keys included), per 128x128 tile, on v6e:
    the exp2 kernel issues no more vector-ALU and transcendental operations than JAX's splash kernel at the same
    blocks, and exactly one exp2 per score vreg plus the running-max corrections."""
    call = kernel_work.REAL_CALLS["wan2.1-1.3b-480p-self"]
    ours, splash = kernel_work.count([("exp2", call, "v6e-1"), ("splash", call, "v6e-1")])
    assert ours.refused is None and splash.refused is None
    assert ours.blocks[:3] == splash.blocks
    assert ours.per_tile["vector"] <= splash.per_tile["vector"]
    assert ours.per_tile["transcendental"] <= splash.per_tile["transcendental"]
    assert "llo.vexp.f32" not in ours.ops_per_tile and 16 <= ours.ops_per_tile["llo.vpow2.f32"] < 17
    assert ours.assumed_taken == 0  # every branch of the exp2 kernel is decided statically


@pytest.mark.slow
@needs_libtpu
def test_a_configuration_mosaic_refuses_is_the_rows_verdict():
    call = kernel_work.REAL_CALLS["wan2.1-14b-720p-self"]
    (row,) = kernel_work.count([("splash", call, "v5e-1")])
    assert row.refused.startswith("RESOURCE_EXHAUSTED") and "\n" not in row.refused


@pytest.mark.slow
@needs_libtpu
def test_cost_reports_each_kernels_work_per_call(tmp_path):
    """``diffusers-tpu cost`` in its own process asks libtpu for Mosaic's passes before it starts: every attention
    kernel the step compiled is listed with its grid and its LLO operations per call; in a process where libtpu
    already started, the report says it could not count them."""
    import json
    import subprocess
    import sys

    out = tmp_path / "cost.json"
    command = "cost --model tiny:wan-4head --chips v6e-4 --height 32 --width 32 --frames 9 --max-sequence-length 24"
    done = subprocess.run(
        [sys.executable, "-m", "diffusers_tpu.commands.cli", *command.split(), "--no-vae", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "kernel diffusers_tpu_flash_attention (grid " in done.stdout
    kernels = json.loads(out.read_text())["denoiser_step"][0]["kernels"]
    assert kernels and all(k["name"] == "diffusers_tpu_flash_attention" for k in kernels)
    for kernel in kernels:
        steps = kernel["grid"][0] * kernel["grid"][1] * kernel["grid"][2]
        assert kernel["per_call"]["transcendental"] > 0 and kernel["per_call"]["mxu"] > 0
        assert kernel["per_grid_step"]["vector"] == round(kernel["per_call"]["vector"] / steps, 1)
    assert kernel_work.start_dump() is None  # this test process: libtpu started (or the flag is set) already


@needs_libtpu
def test_masked_call_skips_chunks_without_a_visible_key_and_selects_only_where_some_are_masked():
    """The Wan cross-attention call (a 100-token prompt in 512 padded text keys): the chunk-visibility table decides
    every branch (none assumed), the chunk with no visible key is skipped, and the kernel issues less vector and
    transcendental work than splash's unmasked kernel; the same call with every key visible issues more."""
    call = kernel_work.REAL_CALLS["wan2.1-1.3b-480p-cross"]
    every = dataclasses.replace(call, visible_keys=call.kv_len)
    prompt, full, splash = kernel_work.count(
        [("exp2", call, "v6e-1"), ("exp2", every, "v6e-1"), ("splash", call, "v6e-1")]
    )
    assert prompt.assumed_taken == full.assumed_taken == 0
    assert prompt.blocks[2] == 256 and call.visible_keys <= 256  # chunk 0 masked per key, chunk 1 skipped
    assert prompt.per_tile["transcendental"] == pytest.approx(full.per_tile["transcendental"] / 2, rel=0.02)
    assert prompt.per_tile["vector"] < full.per_tile["vector"]
    assert prompt.per_tile["vector"] <= splash.per_tile["vector"]
    assert prompt.per_tile["transcendental"] <= splash.per_tile["transcendental"]


def test_without_libtpu_the_counts_say_what_to_install(monkeypatch, capsys):
    import importlib

    monkeypatch.setattr(tpu_compiler, "available", lambda: False)
    with pytest.raises(tpu_compiler.Unavailable, match=r"pip install \"jax\[tpu\]=="):
        kernel_work.count([("exp2", kernel_work.REAL_CALLS["wan2.1-1.3b-480p-self"], "v6e-1")])
    benchmark = importlib.import_module("benchmarks.kernel_work")
    assert benchmark.main(["--calls", "wan2.1-1.3b-480p-self", "--chips", "v6e-1"]) == 2
    assert "needs libtpu, which is not installed" in capsys.readouterr().err


@needs_libtpu
@pytest.mark.parametrize("masked", [False, True])
def test_the_compiled_steps_counter_reads_packed_and_masked_kernel_calls(masked):
    """``hlo_stats`` counts the exp2 kernel's FLOPs from its operands whatever leads them (the chunk table of a
    masked call) and in either layout (packed ``[B, S, H*D]`` here, unpadded): 4 x B x H x Sq x Skv x D."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    from diffusers_tpu.kernels import flash_attention
    from diffusers_tpu.planner import hlo_stats

    sharding = NamedSharding(Mesh(tpu_compiler.devices("v6e-1")[:1], ("one",)), P())
    q = jax.ShapeDtypeStruct((2, 3, 1024, 128), jnp.bfloat16, sharding=sharding)
    kv = jax.ShapeDtypeStruct((2, 3, 512, 128), jnp.bfloat16, sharding=sharding)
    mask = jax.ShapeDtypeStruct((2, 512), jnp.bool_, sharding=sharding)
    if masked:
        compiled = jax.jit(lambda a, b, c, m: flash_attention(a, b, c, kv_mask=m)).lower(q, kv, kv, mask).compile()
    else:
        compiled = jax.jit(flash_attention).lower(q, kv, kv).compile()
    total = hlo_stats.stats(compiled.as_text()).total
    assert total.attention_calls == 1 and total.attention_flops == 4.0 * 2 * 3 * 1024 * 512 * 128
