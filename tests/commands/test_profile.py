"""diffusers-tpu profile: one step's kernels by category, JAX beside stock torch on the same recorded inputs."""

import json

import pytest

from diffusers_tpu.commands import cli, kernel_breakdown, profile_step, subcommand_arguments


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    path = tmp_path_factory.mktemp("profile") / "report.json"
    args = subcommand_arguments.build().parse_args(["profile", "--vs", "torch", "--runs", "2", "--json", str(path)])
    assert profile_step.main(args) == 0
    return json.loads(path.read_text())


def test_both_sides_profile_the_same_step(report):
    assert report["pipeline"] == "WanPipeline" and report["denoiser"] == "transformer"
    assert report["settings"]["calls_per_step"] == 2  # guidance: the conditional and the unconditional pass
    assert report["flop_per_step"] > 0
    for side in ("torch", "jax"):
        entry = report[side]
        assert entry["runs"] == 2 and entry["median_s"] > 0
        breakdown = entry["breakdown"]
        assert breakdown["device_seconds"] > 0 and breakdown["top_kernels"]
        total = sum(c["seconds"] for c in breakdown["categories"].values())
        assert total == pytest.approx(breakdown["device_seconds"])
        assert {k["category"] for k in breakdown["top_kernels"]} <= set(kernel_breakdown.CATEGORIES)
    assert report["torch"]["breakdown"]["categories"]["matmul"]["seconds"] > 0
    jax_side = report["jax"]
    assert jax_side["compilations"] >= 1 and jax_side["recompilations_after_warmup"] == 0
    assert jax_side["platform"] == "cpu" and jax_side["mfu"] is None


@pytest.mark.parametrize(
    "name, expected",
    [
        ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16", "attention"),  # cuDNN (JAX and torch)
        ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128>>", "attention"),
        ("nvjet_tst_256x128_64x4_1x2_h_bz_coopA_NNT", "matmul"),  # cuBLASLt on Hopper
        ("gemm_fusion_dot.12", "matmul"),  # XLA's Triton GEMM fusion
        ("input_transpose_fusion", "copy/transpose"),
        ("input_scatter_fusion.61", "copy/transpose"),
        ("loop_convert_fusion.3", "cast"),
        ("void at::native::vectorized_elementwise_kernel<4, at::native::bfloat16_copy_kernel_cuda>", "cast"),
        ("input_add_reduce_fusion", "norm/reduce"),
        ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float>", "norm/reduce"),
        ("loop_multiply_fusion.7", "elementwise"),
        ("Memcpy DtoD (Device -> Device)", "copy/transpose"),
    ],
)
def test_kernel_names_sort_into_categories(name, expected):
    assert kernel_breakdown.category(name) == expected


def test_torch_only_skips_the_jax_side(tmp_path):
    path = tmp_path / "torch.json"
    args = subcommand_arguments.build().parse_args(
        ["profile", "--vs", "torch", "--torch-only", "--runs", "1", "--json", str(path)]
    )
    assert profile_step.main(args) == 0
    data = json.loads(path.read_text())
    assert "jax" not in data and data["torch"]["median_s"] > 0 and data["torch"]["tflops"] > 0


def test_bad_arguments_are_refused_before_anything_is_built(capsys, monkeypatch):
    built = []
    monkeypatch.setattr(profile_step, "run", lambda args: built.append(args) or {})
    with pytest.raises(SystemExit):
        subcommand_arguments.build().parse_args(["profile", "--runs", "0"])
    assert "--runs: must be a whole number of at least 1" in capsys.readouterr().err
    assert cli.main(["profile", "--torch-only"]) == 2
    assert "add --vs torch" in capsys.readouterr().err and not built
    # doing what the error says is accepted (run is stubbed here; the real run is test_torch_only_skips_the_jax_side)
    args = subcommand_arguments.build().parse_args(["profile", "--torch-only", "--vs", "torch"])
    profile_step.check_arguments(args)
