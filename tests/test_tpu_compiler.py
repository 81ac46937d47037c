"""The real TPU compiler without a TPU (``planner.tpu_compiler``): named slices, quiet libtpu, refusals, and programs
read back from what it compiled."""

import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from diffusers_tpu.interop import compat
from diffusers_tpu.planner import chips, hlo_stats, tpu_compiler

needs_libtpu = pytest.mark.skipif(not tpu_compiler.available(), reason="libtpu (the TPU compiler) not installed")


def test_without_libtpu_the_error_says_how_to_install_it(monkeypatch):
    monkeypatch.setattr(tpu_compiler, "available", lambda: False)
    with pytest.raises(tpu_compiler.Unavailable, match=r'pip install "jax\[tpu\]==' + jax.__version__.replace(".", r"\.")):
        tpu_compiler.devices("v6e-8")


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
    script = ("import diffusers_tpu, jax\nfrom diffusers_tpu.planner import tpu_compiler\n"
              "assert jax.devices()[0].platform == 'cpu'\nassert len(tpu_compiler.devices('v5e-4')) == 4\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path,
                            env={k: v for k, v in __import__("os").environ.items() if not k.startswith("TPU_")})
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
        out = compat.strided_set(out, (Ellipsis, slice(0, None, 2)), (x1 * cos - x2 * sin).astype(x.dtype))
        return compat.strided_set(out, (Ellipsis, slice(1, None, 2)), (x1 * sin + x2 * cos).astype(x.dtype))

    tokens = (1, 32760, 6, 128)
    half = (1, 32760, 1, 64)
    compiled = _compile(rotary, (tokens, jnp.bfloat16, P()), (half, jnp.float32, P()), (half, jnp.float32, P()),
                        devices=tpu_compiler.devices("v6e-1"))
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

    compiled = _compile(layers, ((512, 256), jnp.bfloat16, P(None, "x")), ((7, 256, 256), jnp.bfloat16, P(None, "x")),
                        devices=devices)
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
    error = jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in "
                                       "memory space hbm. Used 40.1G of 31.25G hbm.\nlong details\n...")
    assert tpu_compiler.refusal(error).startswith("RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out")
    assert tpu_compiler.refusal(KeyError("x")) is None
