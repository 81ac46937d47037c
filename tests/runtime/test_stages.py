"""Staged encode -> denoise -> decode: identical to one shot, resumable, skipped when done, loud when broken."""

import json
import signal
import subprocess
import sys
import time

import imageio.v3 as iio
import numpy as np
import pytest
import torch

from diffusers_tpu.runtime.files import stages
from diffusers_tpu.testing import tiny
from tests.conftest import pil_array

SIZES = dict(height=32, width=32, num_frames=9, num_inference_steps=3)
PROMPTS = dict(prompt=tiny.WAN_CALL["prompt"], negative_prompt=tiny.WAN_CALL["negative_prompt"])


def one_shot(pipe, prompts=PROMPTS, **extra):
    frames = pipe(**prompts, **SIZES, **extra, output_type="pil", generator=torch.Generator().manual_seed(0)).frames
    return pil_array(frames).astype(np.uint8)


@pytest.mark.parametrize("family", ["wan", "cogvideox1.5", "hunyuanvideo15"])
@pytest.mark.parametrize("device", ["jax", "cpu"])
def test_staged_equals_one_shot(family, device, tmp_path):
    make = {
        "wan": lambda: tiny.wan_pipeline("wan-4head"),
        "cogvideox1.5": lambda: tiny.cogvideox_pipeline("cogvideox1.5"),
        "hunyuanvideo15": tiny.hunyuan15_pipeline,
    }[family]
    extra = {"max_sequence_length": 32} if family.startswith("cog") else {}
    # HunyuanVideo-1.5: one prompt (stock's VAE cannot decode a batch of 2 in diffusers 0.42), quoted text for ByT5
    prompts = dict(prompt='a sign saying "hi"', negative_prompt="blurry") if family.startswith("hunyuan") else PROMPTS
    pipe = make().to(device)
    expected = one_shot(pipe, prompts, **extra)
    frames = stages.generate(pipe, tmp_path, seed=0, **prompts, **SIZES, **extra)
    assert frames.dtype == np.uint8 and frames.shape == expected.shape
    np.testing.assert_array_equal(frames, expected)
    config = json.loads((tmp_path / "generation_config.json").read_text())
    assert set(config["stages"]) == {"encode", "denoise", "decode"}
    assert config["stages"]["denoise"]["settings"]["num_inference_steps"] == 3


def test_done_stages_are_skipped_and_force_recomputes_downstream(tmp_path):
    pipe = tiny.wan_pipeline("wan").to("jax")
    stages.generate(pipe, tmp_path, seed=0, **PROMPTS, **SIZES)
    calls = []
    original = pipe.encode_prompt
    pipe.encode_prompt = lambda *a, **k: calls.append("encode") or original(*a, **k)
    forward = pipe.transformer.forward
    pipe.transformer.forward = lambda *a, **k: calls.append("denoise") or forward(*a, **k)
    before = (tmp_path / "video.safetensors").stat().st_mtime_ns
    stages.generate(pipe, tmp_path, seed=0, **PROMPTS, **SIZES)
    assert calls == [] and (tmp_path / "video.safetensors").stat().st_mtime_ns == before
    stages.encode(pipe, tmp_path, force=True, **PROMPTS)
    assert calls == ["encode"]
    config = json.loads((tmp_path / "generation_config.json").read_text())
    assert list(config["stages"]) == ["encode"]  # later stages are stale now
    with pytest.raises(stages.StageError, match="run the denoise stage first"):
        stages.decode(pipe, tmp_path)


def test_broken_or_mismatched_stage_files_raise(tmp_path):
    pipe = tiny.wan_pipeline("wan").to("jax")
    with pytest.raises(stages.StageError, match="run the encode stage first"):
        stages.denoise(pipe, tmp_path, **SIZES)
    stages.generate(pipe, tmp_path, seed=0, stop_after="denoise", **PROMPTS, **SIZES)
    with pytest.raises(stages.StageError, match=r"other settings \(seed: 0 -> 1\)"):
        stages.denoise(pipe, tmp_path, seed=1, **SIZES)
    latents = tmp_path / "latents.safetensors"
    data = bytearray(latents.read_bytes())
    data[-5] ^= 0xFF  # flip bits in the tensor data
    latents.write_bytes(bytes(data))
    with pytest.raises(stages.StageError, match="does not match the checksum"):
        stages.decode(pipe, tmp_path)
    latents.unlink()
    with pytest.raises(stages.StageError, match="no 'denoise' output"):
        stages.decode(pipe, tmp_path)
    (tmp_path / "generation_config.json").write_text("{not json")
    with pytest.raises(stages.StageError, match="unreadable"):
        stages.decode(pipe, tmp_path)


def _cli(*args):
    return [sys.executable, "-m", "diffusers_tpu.commands.cli", *args]


@pytest.mark.slow
def test_a_run_killed_after_denoise_is_finished_by_decode(tmp_path):
    """SIGKILL a staged CLI run once its latents are on disk; `decode` alone then gives the one-shot video."""
    stage_dir, common = tmp_path / "run", ["--model", "tiny:cogvideox1.5", "--platform", "cpu"]
    one = subprocess.run(
        _cli("generate", *common, "--output", str(tmp_path / "one.mp4")), capture_output=True, text=True, timeout=600
    )
    assert one.returncode == 0, one.stderr[-3000:]
    run = subprocess.Popen(
        _cli("generate", *common, "--stage-dir", str(stage_dir), "--output", str(tmp_path / "never.mp4")),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 600
    while run.poll() is None and time.time() < deadline:
        if (stage_dir / "latents.safetensors").exists():
            run.send_signal(signal.SIGKILL)
            break
        time.sleep(0.05)
    run.wait(timeout=60)
    decode = subprocess.run(
        _cli("decode", "--stage-dir", str(stage_dir), "--platform", "cpu", "--output", str(tmp_path / "resumed.mp4")),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert decode.returncode == 0, decode.stderr[-3000:]
    np.testing.assert_array_equal(iio.imread(tmp_path / "resumed.mp4"), iio.imread(tmp_path / "one.mp4"))


@pytest.mark.slow
def test_stop_after_then_stage_commands(tmp_path):
    stage_dir = str(tmp_path / "run")
    result = subprocess.run(
        _cli("generate", "--stage-dir", stage_dir, "--stop-after", "encode", "--platform", "cpu"),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0 and "continue with: diffusers-tpu denoise" in result.stdout, result.stderr[-2000:]
    result = subprocess.run(
        _cli("decode", "--stage-dir", stage_dir, "--platform", "cpu"), capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 2 and "run the denoise stage first" in result.stderr
