"""Every distinct 3-D VAE decoder the families run (and the 2-D one with upsamplers), compiled by the TPU compiler (CI's
second command: ``python -m pytest -m tpu_slow``). Their float32 3-D convolutions at full precision ("highest", the
default: each becomes several bf16 passes, each compiled) take the TPU compiler one to two minutes per program even at
tiny sizes, and over ten at 480p (BENCHMARKS.md): the single-chip programs are compiled as the runtime runs them; the
sharded 4-chip ones at ``matmul_precision="default"`` (the same program but for the passes per convolution)."""

import time

import pytest

from diffusers_tpu import TPUConfig
from diffusers_tpu.planner import hlo_stats, tpu_check, tpu_compiler
from tests.planner.test_tpu_families import build

pytestmark = [
    pytest.mark.tpu_slow,
    pytest.mark.skipif(not tpu_compiler.available(), reason="libtpu (the TPU compiler) not installed"),
]

# one tiny pipeline per distinct VAE class (Wan's decoder serves SkyReels, VACE, Animate and causal Wan too)
VAES = {
    "wan": "AutoencoderKLWan",
    "wan22-ti2v": "AutoencoderKLWan (2.2, residual)",
    "cogvideox-5b": "AutoencoderKLCogVideoX",
    "hunyuanvideo15": "AutoencoderKLHunyuanVideo15",
    "hunyuan-video": "AutoencoderKLHunyuanVideo",
    "ltx": "AutoencoderKLLTXVideo",
    "ltx2": "AutoencoderKLLTX2Video",
    "qwen-image": "AutoencoderKLQwenImage",
    "mochi": "AutoencoderKLMochi",
    "z-image": "AutoencoderKL (2-D, with upsamplers: tens of seconds)",
}


def summarise(lowered):
    start = time.perf_counter()
    return hlo_stats.summary(lowered.compile(), seconds=time.perf_counter() - start)


@pytest.mark.parametrize("chip,precision", [("v5e-1", "highest"), ("v6e-4", "default")])
@pytest.mark.parametrize("name", sorted(VAES))
def test_every_3d_vae_decoder_compiles_for_tpu(name, chip, precision):
    pipe, call = build(name)
    config = TPUConfig(text_encoder="host", matmul_precision=precision)
    programs = tpu_check.compile_for(pipe, call, chip, config=config, analyse=summarise)
    decoders = {key: value for key, value in programs.items() if key.startswith("vae_")}
    assert decoders, f"no VAE program recorded for {name}"
    for report in decoders.values():
        assert report["generated_code_bytes"] > 0 and report["output_bytes"] > 0
