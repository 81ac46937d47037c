"""planner/step_estimate.py: the step-time estimate from the TPU compiler's figures, and ``plan`` ranking the candidate
meshes that fit by it."""

import json

import pytest

from diffusers_tpu.planner import step_estimate, tpu_compiler
from diffusers_tpu.planner.chips import CHIPS

needs_libtpu = pytest.mark.skipif(not tpu_compiler.available(), reason="libtpu (the TPU compiler) not installed")


def step(flops=0.0, attention=0.0, bytes_=0.0, collectives=None):
    total = dict(flops=flops, attention_flops=attention, bytes=bytes_, collective_bytes=collectives or {})
    return {"hlo": {"total": total}}


def test_compute_and_memory_overlap_collectives_add():
    v6e = CHIPS["v6e-8"]
    found = step_estimate.estimate(
        step(flops=918e12, attention=918e12, bytes_=1640e9 * 2, collectives={"all-gather": 448e9}), v6e, 0.5
    )
    assert found["compute_seconds"] == pytest.approx(1 + 2)  # matmuls at peak, attention at half of it
    assert found["attention_seconds"] == pytest.approx(2)
    assert found["memory_seconds"] == pytest.approx(2) and found["collective_seconds"] == pytest.approx(1)
    assert found["seconds"] == pytest.approx(3 + 1)
    memory_bound = step_estimate.estimate(step(flops=918e12, bytes_=1640e9 * 5), v6e)
    assert memory_bound["seconds"] == pytest.approx(5)
    assert "ESTIMATE 4 s/step" in step_estimate.describe(found) and "attention at 50% of peak" in (
        step_estimate.describe(found)
    )


def test_what_cannot_be_estimated_is_refused():
    with pytest.raises(ValueError, match="a fraction in"):
        step_estimate.estimate(step(), CHIPS["v6e-8"], 0)
    with pytest.raises(ValueError, match="no published HBM or ICI bandwidth"):
        step_estimate.estimate(step(), CHIPS["v7x-8"])


def test_the_slowest_pass_is_the_steps_estimate_and_an_unbatched_pair_runs_twice():
    v5e = CHIPS["v5e-8"]
    slow, fast = step(flops=197e12 * 3), step(flops=197e12)
    assert step_estimate.of_passes([fast, slow], v5e)["seconds"] == pytest.approx(3)
    twice = step_estimate.of_passes([fast], v5e, calls=2)
    assert twice["seconds"] == pytest.approx(2) and twice["compute_seconds"] == pytest.approx(2)
    assert "(2 calls of the step's program)" in step_estimate.describe(twice)


def row(mesh, seconds):
    return {
        "memory_per_device": {"mesh": mesh},
        "estimate": step_estimate.estimate(step(flops=197e12 * seconds), CHIPS["v5e-8"]),
    }


def test_the_fastest_wins_and_says_why_a_tie_goes_to_the_preferred():
    first, second = row({"dp": 2}, 1.5), row({"dp": 1}, 1.0)
    second["estimate"]["collective_seconds"] = 0.0
    ranked, chosen, reason = step_estimate.rank([first, second])
    for candidate, xla_ops in ((first, 0.2), (second, 0.9)):  # ranked by another estimate: its own parts said
        candidate["compiler_estimate"] = dict(seconds=xla_ops + 1.0, xla_ops_seconds=xla_ops, attention_seconds=1.0)
    assert step_estimate.rank([first, second], "compiler_estimate")[1] is first
    assert "mostly by xla_ops (0.9 vs 0.2 s)" in step_estimate.rank([first, second], "compiler_estimate")[2]
    assert chosen is second and ranked == [second, first]
    assert reason.startswith("mesh {'dp': 1} is estimated 0.5 s/step (33%) faster than the next, {'dp': 2}")
    assert "mostly by compute (1.5 vs 1 s)" in reason
    preferred, close = row({"dp": 2}, 1.005), row({"dp": 1}, 1.0)
    ranked, chosen, reason = step_estimate.rank([preferred, close, row({"sp": 8}, 2.0)])
    assert chosen is preferred and ranked[:2] == [preferred, close]
    assert "2 candidates are estimated within 1% of the fastest" in reason and "first in order of preference" in reason
    assert step_estimate.rank([first])[2] == "mesh {'dp': 2}: the only candidate that fits"


@needs_libtpu
def test_plan_takes_the_fastest_fitting_mesh_by_the_estimate_and_first_fit_the_first(tmp_path, capsys):
    from diffusers_tpu.commands import cli

    base = "plan --model tiny:wan-4head --chips v6e-8 --height 32 --width 32 --frames 9 --no-vae".split()
    ranked, first = tmp_path / "ranked.json", tmp_path / "first.json"
    assert cli.main([*base, "--json", str(ranked)]) == 0
    printed = capsys.readouterr().out
    report = json.loads(ranked.read_text())
    fitting = [row for row in report["candidates"] if row["fits"]]
    assert len(report["candidates"]) > 1 and all("estimate" in row for row in fitting)
    fastest = min(row["estimate"]["seconds"] for row in fitting)
    chosen = report["recommended"]
    assert chosen["estimate"]["seconds"] <= fastest * (1 + step_estimate.TIE)
    tied = [row for row in fitting if row["estimate"]["seconds"] <= fastest * (1 + step_estimate.TIE)]
    assert chosen["memory_per_device"]["mesh"] == tied[0]["memory_per_device"]["mesh"]  # the preferred of the fastest
    assert chosen["chosen_because"].startswith(f"mesh {chosen['memory_per_device']['mesh']}")
    assert "ranked by the step ESTIMATE (not a measurement)" in printed and "chosen: mesh" in printed

    assert cli.main([*base, "--first-fit", "--json", str(first)]) == 0
    report = json.loads(first.read_text())
    assert len(report["candidates"]) == 1  # the first candidate in order of preference fits: nothing else compiled
    assert report["recommended"]["chosen_because"] == "the first candidate in order of preference that fits"


@needs_libtpu
@pytest.mark.slow
def test_plan_ranks_by_the_compiler_s_own_estimate_when_asked(tmp_path, capsys):
    """``--compiler-estimate``: every fitting row gets the TPU compiler's estimate (2 more compiles each), the chosen
    is its fastest (within the tie), and a mesh without dp counts the guidance pair's two calls."""
    from diffusers_tpu.commands import cli

    base = "plan --model tiny:wan-4head --chips v6e-8 --height 32 --width 32 --frames 9 --no-vae".split()
    by_compiler = tmp_path / "compiler.json"
    assert cli.main([*base, "--compiler-estimate", "--json", str(by_compiler)]) == 0
    assert "ranked by the TPU compiler's ESTIMATE" in capsys.readouterr().out
    report = json.loads(by_compiler.read_text())
    fitting = [row for row in report["candidates"] if row["fits"]]
    seconds = [row["compiler_estimate"]["seconds"] for row in fitting]
    assert all(s > 0 for s in seconds) and len(set(seconds)) > 1
    assert report["recommended"]["compiler_estimate"]["seconds"] <= min(seconds) * (1 + step_estimate.TIE)
    dp1 = [row for row in fitting if row["memory_per_device"]["mesh"]["dp"] == 1]
    assert dp1 and all(row["memory_per_device"]["calls_per_step"] == 2 for row in dp1)  # the pair as two calls


def test_plan_refuses_an_attention_efficiency_outside_0_1(capsys):
    from diffusers_tpu.commands import cli

    args = ["plan", "--model", "tiny:wan", "--chips", "v6e-8", "--attention-efficiency", "1.5"]
    assert cli.main(args) == 2
    assert "--attention-efficiency 1.5: a fraction in (0, 1]" in capsys.readouterr().err


@pytest.mark.parametrize(
    "flags, named",
    [
        (["--chips", "v6e-8", "--compiler", "cpu"], "--compiler cpu does not have"),
        (["--chips", "h100-80gb"], "--chips h100-80gb does not have"),
        (["--mesh", "1,1,2", "--hbm-gb", "16"], "--chips (none: --mesh/--hbm-gb) does not have"),
        (["--chips", "v6e-8", "--first-fit"], "--first-fit ranks none"),
    ],
)
def test_plan_refuses_a_compiler_estimate_it_could_not_make(flags, named, capsys):
    """``--compiler-estimate`` without the TPU compiler, or with nothing ranked, would change nothing: refused."""
    from diffusers_tpu.commands import cli

    assert cli.main(["plan", "--model", "tiny:wan", *flags, "--compiler-estimate"]) == 2
    assert named in capsys.readouterr().err


def test_plan_refuses_a_compiler_estimate_when_libtpu_does_not_load(monkeypatch, capsys):
    from diffusers_tpu.commands import cli
    from diffusers_tpu.planner import tpu_compiler

    monkeypatch.setattr(tpu_compiler, "available", lambda: False)
    assert cli.main(["plan", "--model", "tiny:wan", "--chips", "v6e-8", "--compiler-estimate"]) == 2
    assert "--compiler-estimate needs the TPU compiler: install the TPU compiler" in capsys.readouterr().err
