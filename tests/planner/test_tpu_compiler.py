"""The real TPU compiler without a TPU (``planner.tpu_compiler``): named slices, quiet libtpu, refusals, and programs
read back from what it compiled."""

import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from diffusers_tpu.interop.compat import torchax_views
from diffusers_tpu.planner import chips, hlo_stats, kernel_work, tpu_compiler

needs_libtpu = pytest.mark.skipif(not tpu_compiler.available(), reason="libtpu (the TPU compiler) not installed")


def test_without_libtpu_the_error_says_how_to_install_it(monkeypatch):
    monkeypatch.setattr(tpu_compiler, "available", lambda: False)
    with pytest.raises(
        tpu_compiler.Unavailable, match=r'pip install "jax\[tpu\]==' + jax.__version__.replace(".", r"\.")
    ):
        tpu_compiler.devices("v6e-8")


def test_a_libtpu_that_does_not_load_gets_the_same_advice_and_plan_its_cpu_estimate(monkeypatch, capsys):
    """libtpu installed but broken (damaged, mismatched with jax): ``require`` names the failure and the install
    command; ``plan`` falls back to the CPU estimate and says why, never a bare JAX error."""
    from diffusers_tpu.commands import plan_command

    def broken(topology):
        raise RuntimeError("UNKNOWN: TPU initialization failed: libtpu version mismatch")

    monkeypatch.setattr(tpu_compiler, "available", lambda: True)
    monkeypatch.setattr(tpu_compiler, "_devices", broken)
    tpu_compiler.load_failure.cache_clear()
    try:
        assert not tpu_compiler.usable()
        with pytest.raises(tpu_compiler.Unavailable, match=r"installed but does not load \(RuntimeError: UNKNOWN"):
            tpu_compiler.devices("v6e-8")
        with pytest.raises(tpu_compiler.Unavailable, match=r'pip install "jax\[tpu\]=='):
            tpu_compiler.require("diffusers-tpu ready")
        assert plan_command._compilers("auto", tpu_compiler.chip_of("v6e-8")) == ("cpu",)
        assert "installed but does not load" in capsys.readouterr().out
    finally:
        tpu_compiler.load_failure.cache_clear()


def test_a_slice_libtpu_does_not_know_is_refused_by_name():
    with pytest.raises(tpu_compiler.Unavailable, match="CPU estimate"):
        tpu_compiler.devices("v7x-8")
    with pytest.raises(ValueError, match="v6e-8"):
        tpu_compiler.devices("v9-1")


@needs_libtpu
@pytest.mark.parametrize("name", tpu_compiler.tpu_slices())
def test_every_named_slice_compiles_for_its_own_devices(name):
    chip = chips.CHIPS[name]
    devices = tpu_compiler.devices(name)
    assert len(devices) == chip.devices and tpu_compiler.is_tpu(devices)
    kind = {"v5e": "TPU v5 lite", "v6e": "TPU v6 lite", "v5p": "TPU v5", "v4": "TPU v4"}[chip.generation]
    assert {d.device_kind for d in devices} == {kind}


@needs_libtpu
def test_libtpu_loads_silently_on_a_host_without_tpu_chips(tmp_path):
    """Loading the TPU compiler and asking JAX for devices prints nothing (libtpu otherwise complains about the
    absent accelerator) and JAX still runs on the CPU."""
    script = (
        "import diffusers_tpu, jax\nfrom diffusers_tpu.planner import tpu_compiler\n"
        "assert jax.devices()[0].platform == 'cpu'\nassert len(tpu_compiler.devices('v5e-4')) == 4\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={k: v for k, v in __import__("os").environ.items() if not k.startswith("TPU_")},
    )
    assert result.returncode == 0, result.stderr
    noise = [line for line in result.stderr.splitlines() if "torchvision" not in line]
    assert not noise, noise


def _compile(function, *shapes, devices):
    mesh = Mesh(devices, ("x",))
    args = [jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, spec)) for shape, dtype, spec in shapes]
    return jax.jit(function).lower(*args).compile()


@needs_libtpu
def test_wan_rotary_write_compiles_to_little_tpu_code():
    """Wan's rotary embedding (``out[..., 0::2] = ...; out[..., 1::2] = ...``) at Wan2.1-1.3B 480p (32,760 tokens,
    6 heads per device): as pad-with-interior + select it made 35 MB of TPU code per write and 43 s of compile."""

    def rotary(x, cos, sin):
        out = jnp.zeros_like(x)
        x1, x2 = x[..., 0::2], x[..., 1::2]
        out = torchax_views.strided_set(out, (Ellipsis, slice(0, None, 2)), (x1 * cos - x2 * sin).astype(x.dtype))
        return torchax_views.strided_set(out, (Ellipsis, slice(1, None, 2)), (x1 * sin + x2 * cos).astype(x.dtype))

    tokens = (1, 32760, 6, 128)
    half = (1, 32760, 1, 64)
    compiled = _compile(
        rotary,
        (tokens, jnp.bfloat16, P()),
        (half, jnp.float32, P()),
        (half, jnp.float32, P()),
        devices=tpu_compiler.devices("v6e-1"),
    )
    assert compiled.memory_analysis().generated_code_size_in_bytes < 2e6
    assert "scatter" not in compiled.as_text()


@needs_libtpu
def test_program_counts_read_from_the_tpu_compile():
    """Loop bodies weighted by their trip counts, collectives by kind with their bytes per device."""
    devices = tpu_compiler.devices("v6e-4")

    mesh = Mesh(devices, ("x",))

    def layers(x, w):
        def body(i, h):  # the contracted dimension is sharded: every layer's product sums over the devices
            out = jnp.tanh(h @ w[i]).astype(h.dtype)
            return jax.lax.with_sharding_constraint(out, NamedSharding(mesh, P(None, "x")))

        return jax.lax.fori_loop(0, 7, body, x)

    compiled = _compile(
        layers, ((512, 256), jnp.bfloat16, P(None, "x")), ((7, 256, 256), jnp.bfloat16, P(None, "x")), devices=devices
    )
    found = hlo_stats.stats(compiled.as_text())
    loop = found.largest_loop()
    assert loop.trip_count == 7
    assert found.total.instructions >= 7 * loop.counts.instructions
    assert sum(loop.counts.collectives.values()) >= 1, loop.counts
    for kind, count in loop.counts.collectives.items():
        assert found.total.collectives[kind] >= 7 * count
        assert found.total.collective_bytes[kind] >= 7 * loop.counts.collective_bytes[kind] > 0
    report = hlo_stats.summary(compiled, seconds=1.0)
    assert report["generated_code_bytes"] > 0 and report["hlo"]["loops"][0]["trip_count"] == 7


def test_refusals_are_one_line_reasons_and_bugs_are_not():
    error = jax.errors.JaxRuntimeError(
        "RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in "
        "memory space hbm. Used 40.1G of 31.25G hbm.\nlong details\n..."
    )
    assert tpu_compiler.refusal(error).startswith("RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out")
    assert tpu_compiler.refusal(KeyError("x")) is None


REAL_ATTENTION = {
    name: (c.batch, c.heads, c.q_len, c.kv_len, c.head_dim, c.masked) for name, c in kernel_work.REAL_CALLS.items()
}


@pytest.mark.tpu_slow
@needs_libtpu
@pytest.mark.parametrize("chip", ["v5e-1", "v6e-1"])
@pytest.mark.parametrize("name", sorted(REAL_ATTENTION))
def test_default_block_sizes_compile_with_mosaic_at_real_shapes(chip, name):
    """The exp2 kernel's default block sizes, fitted to the real sequences and the chip's VMEM, compile through
    Mosaic's passes; q/k/v are read packed (128-wide heads, and CogVideoX's 64-wide ones two to a lane tile), else
    the sequences are padded no further than the least padding a block allows."""
    from diffusers_tpu.kernels import BlockSizes, block_for, flash_attention, vmem_capacity
    from diffusers_tpu.kernels.blocks import heads_per_block

    batch, heads, q_len, kv_len, head_dim, masked = REAL_ATTENTION[name]
    devices = tpu_compiler.devices(chip)
    vmem = vmem_capacity(devices)
    q = ((batch, heads, q_len, head_dim), jnp.bfloat16, P())
    kv = ((batch, heads, kv_len, head_dim), jnp.bfloat16, P())
    if masked:
        function = lambda q_, k_, v_, m_: flash_attention(q_, k_, v_, kv_mask=m_, vmem_bytes=vmem)  # noqa: E731
        compiled = _compile(function, q, kv, kv, ((batch, kv_len), jnp.bool_, P()), devices=devices)
    else:
        function = lambda q_, k_, v_: flash_attention(q_, k_, v_, vmem_bytes=vmem)  # noqa: E731
        compiled = _compile(function, q, kv, kv, devices=devices)
    kernel = [line for line in compiled.as_text().splitlines() if 'custom_call_target="tpu_custom_call"' in line]
    assert len(kernel) == 1
    operands = [
        tuple(int(n) for n in dims.split(","))
        for dims in __import__("re").findall(r"bf16\[([0-9,]+)\]", kernel[0].split("custom-call(")[0])
    ]
    width = heads_per_block(heads, head_dim) * head_dim
    sizes = BlockSizes().fit(q_len, kv_len, width, 2, vmem)
    assert sizes.vmem_bytes(width, 2) <= vmem
    assert sizes.block_kv == block_for(kv_len, 2816)
    if width % 128 == 0:  # packed: q/k/v read as the projections lay them out, nothing padded or transposed
        inputs = __import__("re").findall(r"bf16\[([0-9,]+)\]", kernel[0].split("operand_layout_constraints=")[1])
        assert operands[0] == (batch, q_len, heads * head_dim)
        assert inputs[:3] == [f"{batch},{q_len},{heads * head_dim}"] + [f"{batch},{kv_len},{heads * head_dim}"] * 2
        return
    padded_q = operands[0][-1]  # folded: the kernel's output is [batch*heads, head_dim, q padded]
    least_q = min(-(-q_len // b) * b for b in range(1664, 3329, 128)) if q_len > 3328 else -(-q_len // 128) * 128
    assert padded_q == -(-q_len // sizes.block_q) * sizes.block_q <= least_q * 1.005


@needs_libtpu
def test_cost_command_reads_the_tpu_compiled_step(tmp_path, capsys):
    """``diffusers-tpu cost``: the step compiled for the slice, counted per layer from the compiled program."""
    import json

    from diffusers_tpu.commands import cli, cost
    from diffusers_tpu.planner import compiler_estimate

    out = tmp_path / "cost.json"
    assert (
        cli.main(
            [
                "cost",
                "--model",
                "tiny:wan-4head",
                "--chips",
                "v6e-4",
                "--height",
                "32",
                "--width",
                "32",
                "--frames",
                "9",
                "--max-sequence-length",
                "24",
                "--no-vae",
                "--estimate",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "TPU v6 lite" in printed and "per iteration of its largest loop" in printed and "ESTIMATE" in printed
    report = json.loads(out.read_text())
    step = report["denoiser_step"][0]
    loop = max(step["hlo"]["loops"], key=lambda loop: loop["instructions"])
    assert loop["trip_count"] == 3  # the tiny model's 3 blocks, block 0 included, as one loop
    assert step["hlo"]["total"]["attention_calls"] >= 2 and step["hlo"]["total"]["flops"] > 0
    assert report["mesh"] == {"dp": 2, "sp": 1, "tp": 2} and report["cfg_batch"] == 2
    assert report["estimate"]["seconds"] > 0 and report["estimate"]["assumptions"]["hbm_gbps"] == 1640
    # the compiler's own estimate, read and said for what it covers (libtpu gives none, a negative number, for some)
    assert "optimal_seconds" in step["xla_cost"]
    assert cost._compiler_estimate(step["xla_cost"]) in printed
    # and made whole for the step (blocks counted from programs cut to 1 and 2 blocks, attention added)
    whole = report["compiler_estimate"]
    assert whole["seconds"] == pytest.approx(whole["xla_ops_seconds"] + whole["attention_seconds"])
    assert whole["attention_seconds"] == pytest.approx(report["estimate"]["attention_seconds"])
    assert compiler_estimate.describe(whole) in printed


def test_the_compiler_s_estimate_is_said_with_what_it_covers():
    from diffusers_tpu.commands import cost

    assert "none for this program (libtpu reports -3" in cost._compiler_estimate({"optimal_seconds": -3.0})
    assert "0.0003 s (XLA's ops" in cost._compiler_estimate({"optimal_seconds": 3e-4})
    assert "not reported" in cost._compiler_estimate({})


def test_cost_refuses_a_slice_without_a_topology_before_loading(capsys):
    from diffusers_tpu.commands import cli

    assert cli.main(["cost", "--model", "tiny:wan", "--chips", "h100-80gb"]) == 2
    assert "v6e-8" in capsys.readouterr().err


@needs_libtpu
def test_plan_step_through_the_tpu_compiler_and_its_refusal(tmp_path):
    """``plan``'s denoiser analysis on TPU devices is the TPU compiler's; a program over the chip's HBM is refused
    by the compiler, which becomes that candidate's verdict (one line), not a crash."""
    import torch

    from diffusers_tpu import TPUConfig
    from diffusers_tpu.planner import plan
    from diffusers_tpu.testing import tiny

    size = dict(height=32, width=32, num_frames=9, guidance_scale=5.0)
    report = plan.denoiser_memory(
        tiny.wan_pipeline("wan-4head"),
        size,
        TPUConfig(dtype=torch.bfloat16),
        tpu_compiler.devices("v5e-4"),
        text_tokens=24,
    )
    assert report["mesh"] == {"dp": 2, "sp": 1, "tp": 2} and 0 < report["argument_bytes"] < report["peak_bytes"]
    error = jax.errors.JaxRuntimeError(
        "RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in "
        "memory space hbm. Used 20G of 15.75G hbm."
    )
    original = plan.start_denoiser_memory

    def refused(*args, **kwargs):
        def finish():
            raise error

        return finish

    try:
        plan.start_denoiser_memory = refused
        row = plan.plan(
            tiny.wan_pipeline("wan-4head"),
            size,
            TPUConfig(dtype=torch.bfloat16),
            tpu_compiler.devices("v5e-4"),
            chips.CHIPS["v5e-4"],
            None,
            24,
        )
    finally:
        plan.start_denoiser_memory = original
    assert row["fits"] is False and row["refused"].startswith("RESOURCE_EXHAUSTED") and "\n" not in row["refused"]


def test_a_long_compile_says_which_program_and_for_how_long(capsys):
    import time
    import types

    def slow(lowered):
        time.sleep(0.35)
        return {"peak_bytes": 1}

    lowered = types.SimpleNamespace(label="the VAE decode chunk", tier="quick")
    assert tpu_compiler.announced(slow, every=0.1)(lowered) == {"peak_bytes": 1}
    out = capsys.readouterr().out
    assert (
        "still compiling the VAE decode chunk [quick] (0 s)" in out
        and "compiled the VAE decode chunk [quick] in" in out
    )
    assert tpu_compiler.announced(lambda lowered: 1, every=5)(lowered) == 1 and capsys.readouterr().out == ""


@needs_libtpu
def test_plan_reports_host_memory_weights_as_the_tpu_compiler_does():
    """With weights in host memory the TPU compiler reports them apart from the device's arguments; the CPU
    estimate (XLA:CPU counts them among the device's) takes them out likewise: on both, the host and device arguments
    add up to the arguments of the weights in device memory, most of them in host memory. (The bytes differ between
    the two: the TPU pads a tiny model's small arrays to its tiles.)"""
    import torch

    from diffusers_tpu import TPUConfig
    from diffusers_tpu.planner import plan
    from diffusers_tpu.testing import tiny

    size, config = dict(height=32, width=32, num_frames=9, guidance_scale=5.0), TPUConfig(dtype=torch.bfloat16)
    hosted = config.replace(weights_in_host_memory=True)
    figures = {
        (where, name): plan.denoiser_memory(tiny.wan_pipeline("wan-4head"), size, c, devices, text_tokens=24)
        for where, devices in (("tpu", tpu_compiler.devices("v5e-1")), ("cpu", jax.devices()[:1]))
        for name, c in (("device", config), ("host", hosted))
    }
    for where in ("tpu", "cpu"):
        device, host = figures[where, "device"], figures[where, "host"]
        assert "host_argument_bytes" not in device
        assert host["argument_bytes"] + host["host_argument_bytes"] == device["argument_bytes"]
        assert host["host_argument_bytes"] > 0.8 * device["argument_bytes"]


@needs_libtpu
@pytest.mark.tpu_slow
def test_plan_reports_host_memory_vae_and_text_encoder_weights_as_the_tpu_compiler_does():
    """The VAE's and the text encoder's programs read their host-memory weights into device memory as they start:
    the TPU compiler reports them as host arguments and among the temporaries; the CPU estimate likewise (tied
    weights once). Before, ``plan`` compiled those programs with the weights in device memory, whatever the config."""
    import torch

    from diffusers_tpu import TPUConfig
    from diffusers_tpu.planner import plan
    from diffusers_tpu.testing import tiny

    size = dict(height=32, width=32, num_frames=9, guidance_scale=5.0)
    config = TPUConfig(dtype=torch.bfloat16, text_encoder="jax")
    hosted = config.replace(weights_in_host_memory=True)
    for devices in (tpu_compiler.devices("v5e-1"), jax.devices()[:1]):
        device, host = (
            plan.denoiser_memory(tiny.wan_pipeline("wan-4head"), size, c, devices, text_tokens=24, vae=True)
            for c in (config, hosted)
        )
        pairs = [(device["vae_decode"]["decode_chunk"], host["vae_decode"]["decode_chunk"])]
        pairs += zip(device["text_encoders"]["programs"], host["text_encoders"]["programs"])
        for in_device, in_host in pairs:
            assert "host_argument_bytes" not in in_device
            assert in_host["argument_bytes"] + in_host["host_argument_bytes"] == in_device["argument_bytes"]
            assert in_host["temp_bytes"] >= in_device["temp_bytes"] + in_host["host_argument_bytes"]
        assert host["text_encoders"]["weight_bytes"] == 0 < device["text_encoders"]["weight_bytes"]
