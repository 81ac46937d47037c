"""diffusers-tpu bench: timings that wait for the device, compile accounting, analytic FLOPs, --vs torch."""

import argparse
import json
import types

import pytest

from diffusers_tpu.commands import bench, stage_timer, subcommand_arguments
from diffusers_tpu.families import cogvideox, wan


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    path = tmp_path_factory.mktemp("bench") / "report.json"
    trace = tmp_path_factory.mktemp("trace")
    args = subcommand_arguments.build().parse_args(
        ["bench", "--vs", "torch", "--runs", "2", "--json", str(path), "--trace", str(trace)]
    )
    assert bench.main(args) == 0
    return json.loads(path.read_text()), trace


def test_report_fields_and_numbers(report):
    data, _ = report
    assert data["pipeline"] == "WanPipeline" and data["versions"]["jax"] and data["date"]
    jax_side = data["jax"]
    assert jax_side["platform"] == "cpu" and jax_side["devices"] == 1 and jax_side["attention"] == "splash_exp2"
    for side in (jax_side, data["torch"]):
        stages = side["stages"]
        assert set(stages) >= {"text_encoding", "steps", "vae_decode", "postprocess", "end_to_end"}
        for entry in stages.values():
            assert entry["count"] > 0 and entry["median_s"] > 0 and entry["mean_s"] > 0
            assert entry["p95_s"] >= entry["median_s"] >= entry["min_s"]
        assert stages["steps"]["count"] == 2 * data["settings"]["num_inference_steps"]  # 2 timed runs
        assert stages["end_to_end"]["median_s"] >= stages["steps"]["median_s"]
    assert jax_side["warmup"]["first_step_s"] > jax_side["stages"]["steps"]["median_s"]  # the cold step compiles
    assert jax_side["stages"]["postprocess"]["bytes_to_host"] == 9 * 64 * 64 * 3  # uint8 frames
    assert jax_side["compile"]["compilations"] > 0 and jax_side["compile"]["seconds"] > 0
    assert jax_side["compile"]["recompilations_after_warmup"] == 0
    assert jax_side["flops"]["per_step"] > 0 and jax_side["flops"]["achieved_tflops"] > 0
    assert jax_side["flops"]["mfu"] is None  # CPU: no MFU


def test_vs_torch_ratios_and_difference(report):
    data, _ = report
    assert data["torch"]["device"] in ("cpu", "cuda")
    assert data["max_output_difference_levels"] <= 1 and data["output_difference_fraction"] <= 1e-3
    for stage, ratio in data["speedup_torch_over_jax"].items():
        expected = data["torch"]["stages"][stage]["median_s"] / data["jax"]["stages"][stage]["median_s"]
        assert ratio == pytest.approx(expected)


def test_profiler_trace_written(report):
    _, trace = report
    assert any(path.suffix == ".pb" for path in trace.rglob("*")), list(trace.rglob("*"))


def test_peak_memory_after_each_stage(monkeypatch, tmp_path, capsys):
    """Where a call's peak happens: the device's peak so far after each stage, for the first call (which compiles)
    and the last. CPU devices report no memory, so a growing reading stands in for one."""
    readings = iter(range(1, 10**6))
    monkeypatch.setattr(stage_timer, "_peak_memory", lambda pipe, cuda: next(readings) * 2**30)
    path = tmp_path / "report.json"
    assert bench.main(subcommand_arguments.build().parse_args(["bench", "--runs", "1", "--json", str(path)])) == 0
    peaks = json.loads(path.read_text())["jax"]["peak_memory_after_stage"]
    for call in ("first_call", "last_call"):
        assert list(peaks[call]) == ["text_encoding", "steps", "vae_decode", "postprocess"]
        assert list(peaks[call].values()) == sorted(peaks[call].values())
    assert max(peaks["first_call"].values()) < min(peaks["last_call"].values())
    assert "peak device memory after each stage, first call: text_encoding 1.00 GiB, steps" in capsys.readouterr().out


def test_wan_flops_by_hand():
    config = types.SimpleNamespace(
        patch_size=(1, 2, 2),
        num_attention_heads=2,
        attention_head_dim=12,
        ffn_dim=32,
        num_layers=2,
        in_channels=16,
        out_channels=16,
        text_dim=32,
    )
    # 64x64 px, 9 frames: latent 3 x 8 x 8 -> S = 3 * 4 * 4 = 48 tokens; d = 24; L = 512 text tokens
    block = (
        8 * 48 * 24 * 24  # self-attention q, k, v, out
        + 4 * 48 * 48 * 24  # scores and values
        + 4 * 48 * 24 * 24  # cross-attention q and out
        + 4 * 512 * 24 * 24  # cross-attention k and v over the text
        + 4 * 48 * 512 * 24  # cross-attention scores and values
        + 4 * 48 * 24 * 32
    )  # MLP
    edges = 2 * 48 * 64 * 24 + 2 * 48 * 24 * 64  # patch embedding (1*2*2*16 = 64 in) and output head (64 out)
    text = 2 * 512 * (32 * 24 + 24 * 24)  # text embedding MLP
    assert wan.forward_flops(config, 3, 8, 8, 512) == 2 * block + edges + text


def test_published_wan_14b_figure():
    """The issue's reference: Wan-14B at 720p x 81 frames is 1.31e16 FLOP per CFG step."""
    per_step = 2 * wan.forward_flops(types.SimpleNamespace(**wan.WAN21_14B), 21, 90, 160, 512)
    assert per_step == pytest.approx(1.31e16, rel=0.01)


def test_cogvideox_flops_by_hand():
    config = types.SimpleNamespace(
        patch_size=2,
        patch_size_t=2,
        num_attention_heads=4,
        attention_head_dim=16,
        num_layers=2,
        in_channels=4,
        out_channels=4,
        text_embed_dim=32,
    )
    # 3 latent frames -> 2 temporal patches; 8 x 8 latent -> 4 x 4: V = 32 video tokens, T = 32 + 32 text; d = 64
    block = 8 * 64 * 64 * 64 + 4 * 64 * 64 * 64 + 4 * 64 * 64 * 256
    edges = 2 * 32 * 32 * 64 + 2 * 32 * 32 * 64 + 2 * 32 * 64 * 32  # patch (2*2*2*4 = 32), text, head
    assert cogvideox.forward_flops(config, 3, 8, 8, 32) == 2 * block + edges


def test_peak_table():
    assert bench.peak_tflops("TPU v6 lite") == 918 and bench.peak_tflops("TPU v5 lite") == 197
    assert bench.peak_tflops("TPU v5p") == 459 and bench.peak_tflops("TPU v4") == 275
    assert bench.peak_tflops("TPU7x") == 2307 and bench.peak_tflops("NVIDIA H100 80GB HBM3") == 989
    assert bench.peak_tflops("NVIDIA H200") == 989 and bench.peak_tflops("cpu") is None


def test_unknown_architecture_is_refused():
    from diffusers_tpu.planner import architectures

    with pytest.raises(ValueError, match="Wan2.1-14B"):
        architectures.build("Wan9-1T")


def test_random_weights_fill_parameters_and_keep_real_buffers():
    import diffusers
    import torch

    from diffusers_tpu.planner import architectures
    from diffusers_tpu.testing import tiny

    model = architectures.empty(lambda: diffusers.WanTransformer3DModel(**tiny.WAN_TRANSFORMERS["wan"]))
    assert any(p.is_meta for p in model.parameters()) and not model.rope.freqs_cos.is_meta
    architectures.fill_random(model, torch.bfloat16, torch.Generator().manual_seed(0))
    assert not any(p.is_meta for p in model.parameters())
    block = model.blocks[0]
    assert block.attn1.to_q.weight.dtype == torch.bfloat16 and 0.01 < block.attn1.to_q.weight.float().std() < 0.03
    assert not block.attn1.to_q.bias.any() and bool((block.attn1.norm_q.weight == 1).all())
    assert block.scale_shift_table.dtype == torch.float32  # _keep_in_fp32_modules, as from_pretrained keeps them
    reference = diffusers.WanTransformer3DModel(**tiny.WAN_TRANSFORMERS["wan"]).rope.freqs_cos
    assert torch.equal(model.rope.freqs_cos, reference)  # buffers are the real ones
    # tied weights stay tied, as from_pretrained ties them: UMT5-XXL's input embedding is its shared table
    encoder = architectures.build("Wan2.1-1.3B", torch.bfloat16, weights=False).text_encoder
    assert encoder.encoder.embed_tokens.weight is encoder.shared.weight
    assert 5.6e9 < sum(p.numel() for p in encoder.parameters()) < 5.8e9  # UMT5-XXL's encoder, 5.7B (not 6.7B)
    tied = architectures.empty(lambda: torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)))
    tied[1].weight = tied[0].weight
    architectures.fill_random(tied, torch.float32, torch.Generator().manual_seed(0))
    assert tied[1].weight is tied[0].weight and not tied[0].weight.is_meta


def test_random_fill_copies_runs_of_one_pool_and_wraps_round():
    import torch

    from diffusers_tpu.planner import architectures

    pool = torch.arange(10, dtype=torch.float32)
    value = torch.empty(3, 5, dtype=torch.bfloat16)
    assert architectures._fill_from(value, pool, 7) == 2  # 15 values from 7: 7, 8, 9, 0, ..., 9, 0, 1
    assert value.flatten().tolist() == [7, 8, 9, *range(10), 0, 1]
    one, two = (architectures.empty(lambda: torch.nn.Linear(64, 64)) for _ in range(2))
    architectures.fill_random(one, torch.float32, torch.Generator().manual_seed(0))
    architectures.fill_random(two, torch.float32, torch.Generator().manual_seed(1))
    assert not torch.equal(one.weight, two.weight)  # another seed, other weights
    assert len(one.weight.unique()) == 64 * 64  # no repeats inside a tensor smaller than the pool


def test_bench_arch_builds_a_registered_architecture(monkeypatch, tmp_path):
    """The --arch path (random weights, no download) end to end, on a small registered architecture; the real
    ones differ only in their configs (too large for a CI machine's RAM)."""
    from diffusers_tpu.planner import architectures
    from diffusers_tpu.testing import tiny, tiny_parts

    small = dict(
        family="wan",
        transformer=tiny.WAN_TRANSFORMERS["wan-4head"],
        flow_shift=3.0,
        vae=tiny.WAN_VAE,
        text_encoder={k: v for k, v in tiny_parts.UMT5.items() if k != "decoder_start_token_id"},
    )
    monkeypatch.setitem(architectures.ARCHITECTURES, "Wan-Test", small)
    path = tmp_path / "arch.json"
    args = subcommand_arguments.build().parse_args(
        [
            "bench",
            "--arch",
            "Wan-Test",
            "--height",
            "32",
            "--width",
            "32",
            "--frames",
            "5",
            "--steps",
            "2",
            "--runs",
            "1",
            "--dtype",
            "bfloat16",
            "--json",
            str(path),
        ]
    )
    assert bench.main(args) == 0
    data = json.loads(path.read_text())
    assert data["model"] == "Wan-Test" and data["settings"]["dtype"] == "bfloat16"
    assert data["jax"]["compile"]["recompilations_after_warmup"] == 0
    assert data["jax"]["stages"]["steps"]["count"] == 2


@pytest.mark.parametrize(
    "spec", ["fbc", "fbc:0.2", "mag:0.3", "sea:0.5", "taylor", "taylor:3", "pab:2", "faster:3", "textkv"]
)
def test_bench_cache_takes_each_cache_form(spec):
    assert subcommand_arguments.cache_arg(spec) == spec


@pytest.mark.parametrize(
    "spec", ["taylor:1", "taylor:2.5", "pab:x", "fbc:-1", "teacache", "mag:0", "faster:1", "sea:0", "textkv:2"]
)
def test_bench_cache_refuses_nonsense_naming_the_forms(spec):
    with pytest.raises(argparse.ArgumentTypeError, match=r"mag\[:threshold\], sea\[:threshold\], taylor\[:interval\]"):
        subcommand_arguments.cache_arg(spec)


@pytest.mark.skipif(not hasattr(__import__("diffusers"), "TextKVCacheConfig"), reason="new in diffusers 0.42")
def test_bench_an_image_pipeline_with_text_kv_cache(tmp_path, capsys):
    """An image pipeline (no video processor) benches; ``--cache textkv`` on any other class is refused naming the
    model it is for, and that model benches with it: every pass computed, both outputs stock's (``--vs torch``)."""
    wrong = subcommand_arguments.build().parse_args(["bench", "--model", "tiny:flux", "--cache", "textkv"])
    with pytest.raises(ValueError, match="try --model tiny:nucleusmoe-image"):
        bench.main(wrong)
    path = tmp_path / "report.json"
    argv = ["bench", "--model", "tiny:nucleusmoe-image", "--cache", "textkv", "--steps", "3", "--runs", "1"]
    args = subcommand_arguments.build().parse_args([*argv, "--vs", "torch", "--json", str(path)])
    assert bench.main(args) == 0
    data = json.loads(path.read_text())
    assert data["pipeline"] == "NucleusMoEImagePipeline" and data["settings"]["cache"] == "textkv"
    assert data["jax"]["compile"]["recompilations_after_warmup"] == 0
    cache = data["jax"]["cache"]
    assert cache["cached_passes"] == 0 and cache["denoiser_passes"] == data["torch"]["cache"]["denoiser_passes"] > 0
    assert data["max_output_difference_levels"] <= 1
    assert "it skips no pass" in capsys.readouterr().out
