"""CausalWanPipeline: streaming blocks on JAX equal the plain torch pipeline; nothing compiles after the first
block; the streaming VAE decode equals one stock decode; options and per-block inputs act where they should."""

import numpy as np
import pytest
import torch

from diffusers_tpu.families import wan_vae
from diffusers_tpu.interop import compile_accounting, user_tensors
from diffusers_tpu.testing import tiny
from tests.conftest import assert_np_matches, assert_pil_matches, stock_pil

CALL = dict(
    prompt=["a cat walks on the grass", "a red fox jumps over a sleeping dog in the snow"],
    num_blocks=3,
    height=32,
    width=48,
    max_sequence_length=24,
)


def _run(pipe, seed=0, **overrides):
    return pipe(**dict(CALL, **overrides), generator=torch.Generator().manual_seed(seed)).frames


@pytest.fixture(scope="module")
def pipes():
    reference = tiny.causal_wan_pipeline()
    reference.set_progress_bar_config(disable=True)
    on_jax = tiny.causal_wan_pipeline()
    on_jax.set_progress_bar_config(disable=True)
    on_jax.to("jax")
    return reference, on_jax


def test_jax_matches_torch_and_compiles_only_in_the_first_block(pipes):
    reference, pipe = pipes
    expected = _run(reference)
    expected_pil = stock_pil(expected)
    assert expected.shape == (2, 1 + 4 * (3 * 2 - 1), 32, 48, 3)  # 3 blocks x 2 latent frames
    out = _run(pipe)
    first_call = [block.compilations for block in pipe.block_timings]
    assert_np_matches(out, expected)
    assert first_call[0] > 0 and first_call[1:] == [0, 0], first_call
    assert_pil_matches(_run(pipe, output_type="pil"), expected_pil)
    blocks = list(pipe.stream(**CALL, generator=torch.Generator().manual_seed(0)))
    assert [block.shape[1] for block in blocks] == [5, 8, 8]
    assert np.array_equal(np.concatenate(blocks, axis=1), out)  # stream == __call__
    assert [block.compilations for block in pipe.block_timings] == [0, 0, 0]


def test_per_block_timings(pipes):
    _, pipe = pipes
    _run(pipe, timing=True, denoising_steps=(1000, 500))
    timings = pipe.block_timings
    assert [t.frames for t in timings] == [5, 8, 8]
    assert all(len(t.forward_seconds) == 3 for t in timings)  # 2 denoising steps + the cache refresh
    assert all(t.seconds >= sum(t.forward_seconds) > 0 for t in timings)
    _run(pipe)
    assert all(not t.forward_seconds for t in pipe.block_timings)  # not synchronized unless asked


def test_streaming_decode_equals_one_stock_decode(pipes):
    reference, pipe = pipes
    latents = _run(reference, output_type="latent")
    vae = reference.vae
    mean = torch.tensor(vae.config.latents_mean).view(1, -1, 1, 1, 1)
    latents = latents / (1.0 / torch.tensor(vae.config.latents_std).view(1, -1, 1, 1, 1)) + mean
    with torch.no_grad():
        whole = vae.decode(latents, return_dict=False)[0]
        for per_block in (1, 3):  # a block holding frame 1 alone; blocks past the first two frames
            decoder = wan_vae.StreamingDecoder(vae)
            streamed = torch.cat([decoder.decode(latents[:, :, i : i + per_block]) for i in range(0, 6, per_block)], 2)
            torch.testing.assert_close(streamed, whole, rtol=0, atol=1e-6)
    from diffusers_tpu.interop import compile_accounting
    from diffusers_tpu.runtime.attach import pipeline_runtime

    attached = pipeline_runtime.runtime_of(pipe)
    for per_block in (1, 3):
        decoder, pieces, compilations = wan_vae.StreamingDecoder(pipe.vae), [], []
        for i in range(0, 6, per_block):
            with attached.jax_context(), compile_accounting.compile_log() as log:
                pieces.append(user_tensors.to_host(decoder.decode(latents[:, :, i : i + per_block])))
            compilations.append(log.compilations)
        assert (torch.cat(pieces, 2) - whole).abs().max() <= 1e-4
        assert compilations[1:] == [0] * (len(compilations) - 1), compilations


def test_block_options_act_on_the_right_blocks(pipes):
    reference, _ = pipes
    base = _run(reference)
    other = reference.encode_prompt(
        "a storm over the sea", do_classifier_free_guidance=False, num_videos_per_prompt=2, max_sequence_length=24
    )[0]
    switched = _run(reference, block_inputs=lambda i: {"encoder_hidden_states": other} if i == 2 else {})
    assert np.array_equal(switched[:, :13], base[:, :13]) and np.abs(switched[:, 13:] - base[:, 13:]).max() > 1e-3
    for option in (dict(refresh_cache=False), dict(context_noise=100.0)):  # the cache is read from block 1 on
        changed = _run(reference, **option)
        assert np.array_equal(changed[:, :5], base[:, :5]) and np.abs(changed[:, 5:] - base[:, 5:]).max() > 1e-3


@pytest.mark.parametrize(
    "bad, message",
    [
        (dict(height=40), "height=40 must be a positive multiple of 16"),
        (dict(denoising_steps=(500, 700)), "must be decreasing"),
        (dict(context_noise=1000), "context_noise"),
        (dict(num_blocks=0), "num_blocks=0"),
        (dict(num_blocks=17), "rope_max_seq_len=32"),
        (dict(output_type="mp4"), "output_type"),
        (dict(prompt=None), "exactly one of prompt"),
    ],
)
def test_bad_input_fails_before_anything_runs(pipes, bad, message):
    _, pipe = pipes

    with compile_accounting.compile_log() as log, pytest.raises(ValueError, match=message):
        _run(pipe, **bad)
    assert log.compilations == 0


def test_wrong_scheduler_names_the_fix():
    from diffusers import FlowMatchEulerDiscreteScheduler

    pipe = tiny.causal_wan_pipeline()
    pipe.scheduler = FlowMatchEulerDiscreteScheduler(shift=5.0)
    with pytest.raises(ValueError, match=r"FlowMatchLCMScheduler\(shift=5.0\)"):
        next(pipe.stream("a cat", num_blocks=1, height=32, width=32))


def test_bench_reports_per_block_figures(pipes):
    from diffusers_tpu.commands import bench, stage_timer

    _, pipe = pipes
    report, frames = stage_timer.measure(pipe, dict(CALL, output_type="pil", num_frames=9), runs=2, warmup=1)
    blocks = report["blocks"]
    assert blocks["forward"]["count"] == 2 * 3 * 4 and blocks["forwards_per_block"] == 4  # 3 steps + refresh
    assert blocks["block"]["count"] == 2 * 2 and blocks["frames_per_block"] == 8 and blocks["fps"] > 0
    assert blocks["compilations_after_first_block"] == 0 and report["compile"]["recompilations_after_warmup"] == 0
    assert frames.shape == (2, 21, 32, 48, 3) and "steps" not in report["stages"]
    assert "frames/s (steady blocks)" in "\n".join(bench._block_lines(blocks, None))


@pytest.mark.slow
def test_cli_streams_the_requested_blocks(tmp_path):
    import imageio.v3 as iio

    from tests.commands.test_cli import run_cli

    out = tmp_path / "stream.mp4"
    result = run_cli(
        "generate",
        "--model",
        "tiny:causal-wan",
        "--blocks",
        "2",
        "--height",
        "32",
        "--width",
        "32",
        "--platform",
        "cpu",
        "--output",
        str(out),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert iio.imread(out).shape == (1 + 4 * 3, 32, 32, 3)  # 2 blocks x 2 latent frames
