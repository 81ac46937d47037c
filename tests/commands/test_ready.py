"""``diffusers-tpu ready``: every program of a first call compiled for a TPU slice and timed."""

import json

import pytest

from diffusers_tpu.commands import cli, program_table
from diffusers_tpu.planner import tpu_compiler


def test_rows_name_every_program_and_each_build_of_a_tiered_one():
    step = dict(compile_seconds=20.0, generated_code_bytes=2e7, temp_bytes=1 << 30, tier="full")
    quick, full = dict(step, tier="quick", compile_seconds=5.0), dict(step, compile_seconds=60.0)
    report = {
        "passes": [step],
        "vae_decode": {"decode_first": dict(full, tiers=[quick, full]), "peak_bytes": 1},
        "text_encoders": {"programs": [step], "peak_bytes": 1, "weight_bytes": 1},
    }
    rows = program_table.programs_of(report)
    assert [name for name, _ in rows] == [
        "denoiser step",
        "vae decode: decode_first [quick]",
        "vae decode: decode_first [full]",
        "text encoders: program 1 [full]",
    ]
    result = dict(
        model="m",
        chips="v6e-1",
        device_kind="TPU v6 lite",
        size=dict(height=8, width=8, num_frames=1),
        mesh={},
        vae_compile="tiered",
        workers=2,
        programs=[
            dict(program=n, **{k: a[k] for k in ("compile_seconds", "generated_code_bytes", "temp_bytes")})
            for n, a in rows
        ],
        compile_seconds_sum=105.0,
        wall_seconds=70.0,
    )
    text = program_table.render(result)
    assert (
        "vae decode: decode_first [quick]" in text
        and "ready after 70.0 s" in text
        and "sum of compile seconds 105.0" in text
    )


def test_ready_refuses_a_slice_the_tpu_compiler_does_not_know(capsys):
    assert cli.main(["ready", "--model", "tiny:wan", "--chips", "h100-80gb"]) == 2
    assert "not a TPU slice" in capsys.readouterr().err


@pytest.mark.tpu_slow
@pytest.mark.skipif(not tpu_compiler.available(), reason="libtpu (the TPU compiler) not installed")
def test_ready_compiles_a_tiny_pipeline_for_tpu(tmp_path, capsys):
    out = tmp_path / "ready.json"
    code = cli.main(
        ["ready", "--model", "tiny:wan-4head", "--chips", "v6e-1", "--height", "32", "--width", "32", "--frames", "9"]
        + ["--vae-compile", "quick", "--json", str(out)]
    )
    assert code == 0
    result = json.loads(out.read_text())
    names = [row["program"] for row in result["programs"]]
    assert names == ["denoiser step", "vae decode: decode_first [quick]", "vae decode: decode_chunk [quick]"]
    assert all(row["compile_seconds"] > 0 and row["generated_code_bytes"] > 0 for row in result["programs"])
    assert result["wall_seconds"] > 0
    # the TPU compiler's own estimate, read per program; the step's loop body (3 blocks, one loop) counted once: marked
    step, *decode = result["programs"]
    assert all(row["compiler_seconds"] > 0 for row in decode) and step["has_loops"] and not decode[0]["has_loops"]
    printed = capsys.readouterr().out
    assert "libtpu est." in printed and f"{step['compiler_seconds']:.3g}*" in printed
