"""How VAE programs are built (``TPUConfig.vae_compile``, ``runtime.program_builds``): XLA's quick effort, the full
effort, and tiers (quick at once, full from a background thread), with the same results in every mode."""

import jax
import numpy as np
import pytest
import torch

from diffusers_tpu import TPUConfig
from diffusers_tpu.interop import compile_accounting, user_tensors
from diffusers_tpu.runtime.programs import program_builds
from diffusers_tpu.testing import tiny


def latents(frames: int) -> torch.Tensor:
    return torch.randn(1, 16, frames, 4, 6, generator=torch.Generator().manual_seed(frames))


def decode_programs(pipe) -> list:
    programs = pipe.vae._diffusers_tpu_programs
    return [p.executable for name in ("decode_first", "decode_chunk") for p in programs[name].programs.values()]


def test_modes_resolve_per_platform_and_bad_ones_are_named():
    assert program_builds.resolve("auto", "tpu") == "quick" and program_builds.resolve("auto", "cpu") == "full"
    assert program_builds.resolve("tiered", "cpu") == "tiered" and program_builds.resolve("full", "tpu") == "full"
    with pytest.raises(ValueError, match=r"vae_compile='fast'.*'quick', 'full', 'tiered'"):
        TPUConfig(vae_compile="fast")
    built = program_builds.builds(object(), "tiered", "cpu")
    assert [(b.tier, b.options) for b in built] == [("quick", program_builds.QUICK), ("full", {})]


def test_tiered_programs_serve_quick_then_full_with_the_same_frames(tmp_path):
    z = latents(3)
    full = tiny.wan_pipeline("wan").to("jax", config=TPUConfig(vae_compile="full", compile_cache_dir=False))
    expected = user_tensors.to_host(full.vae.decode(z).sample)
    assert not any(isinstance(e, program_builds.Tiered) for e in decode_programs(full))
    full.to("cpu")
    config = TPUConfig(vae_compile="tiered", compile_cache_dir=str(tmp_path))
    pipe = tiny.wan_pipeline("wan").to("jax", config=config)
    with compile_accounting.compile_log() as log:
        first = user_tensors.to_host(pipe.vae.decode(z).sample)
        tiered = decode_programs(pipe)
        assert len(tiered) == 2 and all(isinstance(e, program_builds.Tiered) for e in tiered)
        assert all(e.tier == "quick" for e in tiered)  # served before any full build was asked for
        assert program_builds.wait_for_builds(timeout=300)
    assert log.background == 2  # the two full builds, not counted as the call's compilations
    with compile_accounting.compile_log() as log:
        second = user_tensors.to_host(pipe.vae.decode(z).sample)
    assert log.compilations == 0 and all(e.tier == "full" for e in tiered)  # swapped in at this call
    assert np.array_equal(first.numpy(), expected.numpy()) and np.array_equal(second.numpy(), expected.numpy())
    pipe.to("cpu")
    # a later pipeline with the same cache finds the full builds noted there: no quick build, no background thread
    again = tiny.wan_pipeline("wan").to("jax", config=config)
    assert np.array_equal(user_tensors.to_host(again.vae.decode(z).sample).numpy(), expected.numpy())
    assert all(e.tier == "full" and e._thread is None for e in decode_programs(again))
    again.to("cpu")


def test_a_full_build_that_does_not_fit_leaves_the_quick_one_serving(monkeypatch):
    monkeypatch.setattr(program_builds, "fits", lambda executable: False)
    pipe = tiny.wan_pipeline("wan").to("jax", config=TPUConfig(vae_compile="tiered", compile_cache_dir=False))
    z = latents(3)
    pipe.vae.decode(z)
    assert program_builds.wait_for_builds(timeout=300)
    pipe.vae.decode(z)
    assert all(e.full is not None and e.tier == "quick" for e in decode_programs(pipe))
    pipe.to("cpu")


def test_fits_reads_the_devices_free_memory():
    compiled = jax.jit(lambda x: x @ x).lower(jax.numpy.ones((8, 8))).compile()
    assert program_builds.fits(compiled)  # CPU devices report no memory: nothing to refuse

    class Device:
        process_index = 0

        def memory_stats(self):
            return {"bytes_limit": 100, "bytes_in_use": 60}  # 40 bytes free

    class Executable:
        def __init__(self, temp, output, alias):
            self.analysis = type("Analysis", (), dict(temp_size_in_bytes=temp, output_size_in_bytes=output))()
            self.analysis.alias_size_in_bytes = alias
            self.input_shardings = ((type("Sharding", (), {"device_set": {Device()}})(),), {})

        def memory_analysis(self):
            return self.analysis

    assert not program_builds.fits(Executable(temp=30, output=20, alias=5))  # needs 45
    assert program_builds.fits(Executable(temp=30, output=20, alias=15))  # needs 35


def test_plans_analyse_each_vae_program_as_the_runtime_builds_it():
    """``plan``/``cost``/``tpu_check`` see every VAE program through its builds (a tiered one: both, the larger peak
    planned); the denoiser step keeps its full-effort build. (The builds' TPU compiles themselves run in CI's second
    command: ``tests/planner/test_tpu_vae.py``.)"""
    from diffusers_tpu.planner import tpu_check, tpu_compiler

    if not tpu_compiler.available():
        pytest.skip("libtpu (the TPU compiler) not installed")
    pipe = tiny.wan_pipeline("wan-4head")
    call = dict(prompt="a cat", negative_prompt="blurry", height=32, width=32, num_frames=9, max_sequence_length=24)
    seen = []

    def analyse(lowered):  # what each build would report, without the TPU compiler's minutes
        options = getattr(lowered, "options", None)
        seen.append(options)
        return {"peak_bytes": 1 if options == program_builds.QUICK else 2, "options": options}

    for mode, tiers in (("tiered", [program_builds.QUICK, {}]), ("auto", [program_builds.QUICK]), ("full", [{}])):
        seen.clear()
        config = TPUConfig(text_encoder="host", vae_compile=mode)
        programs = tpu_check.compile_for(pipe, call, "v6e-1", config=config, analyse=analyse)
        vae = {name: report for name, report in programs.items() if name.startswith("vae_")}
        assert set(vae) == {"vae_decode_first", "vae_decode_chunk"}
        assert seen == [None] + tiers * 2, mode  # the step, then each VAE program's builds
        if mode == "tiered":
            assert all(report["options"] == {} and len(report["tiers"]) == 2 for report in vae.values())
