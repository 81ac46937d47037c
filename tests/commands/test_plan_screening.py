"""``plan``'s ranking screens every candidate with the step compiled at XLA's quick effort and compiles at full effort
(as the runtime builds the step) only the candidates that could still win or whose fit is in doubt."""

import json

import pytest

from diffusers_tpu.commands import plan_screening
from diffusers_tpu.planner import step_estimate, tpu_compiler
from diffusers_tpu.planner.chips import CHIPS, GIB

needs_libtpu = pytest.mark.skipif(not tpu_compiler.available(), reason="libtpu (the TPU compiler) not installed")


def _row(mesh, seconds, total_gib, memory_bound=False, effort="quick", temps_gib=3.0, decode_gib=None):
    """A row whose step's total is ``total_gib`` (``temps_gib`` of it temporaries), its decode's ``decode_gib``."""
    estimate = dict(  # seconds = max(compute, memory) + collectives, as ``step_estimate`` gives them
        seconds=seconds,
        compute_seconds=seconds * (0.5 if memory_bound else 0.9),
        memory_seconds=seconds * (0.9 if memory_bound else 0.5),
        collective_seconds=seconds * 0.1,
    )
    step = dict(peak_bytes=total_gib * GIB, temp_bytes=temps_gib * GIB)
    total = max(total_gib, decode_gib or 0)
    return dict(
        memory_per_device=dict(step, mesh=mesh, passes=[step]),
        estimate=estimate,
        total_bytes_per_device=total * GIB,
        steps_bytes_per_device=total_gib * GIB,
        decode_bytes_per_device=decode_gib and decode_gib * GIB,
        text_encode_bytes_per_device=None,
        fits=total <= 32 * 0.98,
        step_effort=effort,
        compiler="TPU",
        config=dict(mesh),
    )


@pytest.fixture
def confirmations(monkeypatch):
    """``plan_all`` replaced: a confirmation gives the row at full effort with the same figures (or those set)."""
    done, full = [], {}

    def plan_all(pipe, call, configs, devices, **planned):
        (config,) = configs
        done.append(config)
        row = _row(config, *full.get(tuple(config.items()), (1.0, 10.0)), effort="full")
        yield row

    monkeypatch.setattr(plan_screening, "plan_all", plan_all)
    monkeypatch.setattr(plan_screening.plan_lines, "line", lambda row: str(row["memory_per_device"]))
    return done, full


PLANNED = dict(chip=CHIPS["v6e-8"], hbm_gib=None)


def test_a_leader_far_from_the_memory_limit_is_not_recompiled(confirmations):
    done, _ = confirmations
    rows = [_row({"dp": 2}, 1.0, 10.0), _row({"dp": 1}, 1.005, 11.0), _row({"tp": 8}, 1.3, 9.0)]
    plan_screening.confirm_at_full_effort(None, {}, None, rows, list(rows), PLANNED, 0.0)
    assert done == []  # compute-bound and far below 32 GiB: the quick-effort figures rank it as the full ones would
    assert all(row["step_effort"] == "quick" for row in rows)


def test_a_leader_whose_fit_is_in_doubt_is_confirmed_and_the_next_taken_if_it_no_longer_fits(confirmations):
    done, full = confirmations
    rows = [_row({"dp": 2, "sp": 4}, 0.98, 30.5), _row({"dp": 2, "tp": 4}, 1.0, 11.0)]  # 32.3 GiB at 1.6x
    full[(("dp", 2), ("sp", 4))] = (0.98, 33.0)  # at full effort it does not fit
    listed = list(rows)
    plan_screening.confirm_at_full_effort(None, {}, None, rows, listed, PLANNED, 0.0)
    assert done == [{"dp": 2, "sp": 4}]
    assert rows[0]["step_effort"] == "full" and not rows[0]["fits"] and listed[0] is rows[0]
    assert rows[1]["step_effort"] == "quick"  # the new leader: 11 GiB, compute-bound, not in doubt


def test_a_memory_bound_leader_is_confirmed_then_the_rivals_that_could_still_overtake_it(confirmations):
    """The bytes a step moves grow at full effort (1.00-1.20x measured): a memory-bound leader may slow down, so it
    is compiled as the runtime builds it first; then a rival whose quick figures could still beat it is, and one that
    could not (20% slower) is left quick."""
    done, full = confirmations
    rows = [_row({"dp": 2}, 1.0, 10.0, memory_bound=True), _row({"sp": 2}, 1.03, 10.0, memory_bound=True)]
    rows.append(_row({"tp": 8}, 1.2, 10.0, memory_bound=True))
    full[(("dp", 2),)] = (1.05, 10.0)  # slower at full effort
    plan_screening.confirm_at_full_effort(None, {}, None, rows, list(rows), PLANNED, 0.0)
    assert done == [{"dp": 2}, {"sp": 2}]  # {"sp": 2} is the leader after (1.0 at full effort, the fixture's)
    assert rows[2]["step_effort"] == "quick"


def test_a_compute_bound_leader_and_rivals_are_not_recompiled():
    """Compute-bound steps keep their estimate whatever the effort: nothing to confirm (the issue's 14B 720p ranking:
    3.20 / 3.23 / 3.23 s/step, compute 3.06 s, memory at most 1.9 s)."""
    rows = [_row({"dp": 2}, 1.0, 10.0), _row({"sp": 2}, 1.001, 10.0), _row({"tp": 8}, 1.2, 10.0)]
    assert plan_screening.to_confirm(rows, PLANNED["chip"].usable_gib() * GIB) == []


def test_a_candidate_that_may_fit_at_full_effort_and_would_win_is_confirmed(confirmations):
    done, full = confirmations
    rows = [_row({"dp": 2}, 0.9, 33.0, temps_gib=4.0), _row({"tp": 4}, 1.0, 11.0)]  # 30.6 GiB at 0.4x temporaries
    full[(("dp", 2),)] = (0.9, 31.0)
    plan_screening.confirm_at_full_effort(None, {}, None, rows, list(rows), PLANNED, 0.0)
    assert done == [{"dp": 2}] and rows[0]["fits"]
    rows = [_row({"dp": 2}, 1.2, 33.0, temps_gib=4.0), _row({"tp": 4}, 1.0, 11.0)]  # slower even if it fits
    assert plan_screening.to_confirm(rows, PLANNED["chip"].usable_gib() * GIB) == []


def test_a_leader_near_the_limit_by_its_exact_figures_is_not_recompiled(confirmations):
    """The issue's 14B 720p leader on v6e-8: 30.67 of 32 GiB set by its VAE decode (compiled as the runtime builds
    it), its step 29.89 GiB with 2.72 GiB of temporaries: within the measured range of the effort, the step stays
    below the memory, so the full-effort compile could not change the verdict."""
    done, _ = confirmations
    rows = [_row({"dp": 2, "sp": 4}, 0.98, 29.89, temps_gib=2.72, decode_gib=30.67), _row({"tp": 4}, 1.0, 11.0)]
    plan_screening.confirm_at_full_effort(None, {}, None, rows, list(rows), PLANNED, 0.0)
    assert done == [] and rows[0]["step_effort"] == "quick"
    hbm = PLANNED["chip"].usable_gib() * GIB
    assert not plan_screening.fit_in_doubt(rows[0], hbm)
    assert plan_screening.fit_in_doubt(_row({}, 1.0, 29.89, temps_gib=4.0, decode_gib=30.67), hbm)  # 32.3 at 1.6x
    assert not plan_screening.fit_in_doubt(_row({}, 1.0, 20.0, temps_gib=4.0, decode_gib=33.0), hbm)  # decode: never
    assert plan_screening.fit_in_doubt(_row({}, 1.0, 33.0, temps_gib=4.0), hbm)  # fits at 0.4x the temporaries
    assert not plan_screening.fit_in_doubt(_row({}, 1.0, 36.0, temps_gib=4.0), hbm)  # 33.6 GiB even at 0.4x


def test_when_nothing_fits_the_candidates_near_the_limit_are_confirmed(confirmations):
    done, full = confirmations
    rows = [_row({"dp": 2}, 1.0, 36.0, temps_gib=10.0), _row({"tp": 8}, 1.1, 60.0)]
    full[(("dp", 2),)] = (1.0, 30.0)  # fits once compiled as the runtime does
    plan_screening.confirm_at_full_effort(None, {}, None, rows, list(rows), PLANNED, 0.0)
    assert done == [{"dp": 2}] and rows[0]["fits"] and rows[1]["step_effort"] == "quick"


@needs_libtpu
def test_the_screening_chooses_what_compiling_every_candidate_at_full_effort_chooses(tmp_path, capsys):
    from diffusers_tpu.commands import cli

    base = "plan --model tiny:wan-4head --chips v6e-8 --height 32 --width 48 --frames 13 --no-vae".split()
    screened, full = tmp_path / "screened.json", tmp_path / "full.json"
    assert cli.main([*base, "--json", str(screened)]) == 0
    out = capsys.readouterr().out
    assert "[TPU compiler, quick effort]" in out
    assert cli.main([*base, "--all", "--json", str(full)]) == 0
    screened, full = json.loads(screened.read_text()), json.loads(full.read_text())
    efforts = [row["step_effort"] for row in screened["candidates"]]
    assert "quick" in efforts and efforts.count("full") == out.count("[confirmed at full effort")  # each one said
    ranked_quick = any(row["fits"] and row["step_effort"] == "quick" for row in screened["candidates"])
    assert ("[quick-effort compile] rows keep" in screened["recommended"]["chosen_because"]) == ranked_quick
    assert {row["step_effort"] for row in full["candidates"]} == {"full"}
    quick = {str(row["memory_per_device"]["mesh"]): row["estimate"] for row in screened["candidates"]}
    for row in full["candidates"]:  # FLOPs and collectives are the partitioner's, whatever the effort
        found = quick[str(row["memory_per_device"]["mesh"])]
        for part in ("compute_seconds", "collective_seconds"):
            assert found[part] == pytest.approx(row["estimate"][part], rel=0.02, abs=1e-12), part
    by_mesh = {str(row["memory_per_device"]["mesh"]): row for row in full["candidates"]}
    pick = by_mesh[str(screened["recommended"]["memory_per_device"]["mesh"])]  # the screened pick, at full effort
    fastest = min(row["estimate"]["seconds"] for row in full["candidates"] if row["fits"])
    assert pick["fits"] and pick["estimate"]["seconds"] <= fastest * (1 + step_estimate.TIE)


def test_the_recommendation_says_why_quick_rows_were_not_compiled_again():
    note = plan_screening.quick_rows_note([_row({"dp": 2}, 1.0, 10.0), _row({"tp": 4}, 1.1, 10.0, effort="full")])
    assert "[quick-effort compile] rows keep" in note and "0.4-1.6x" in note and "0.97-1.3x" in note
    assert plan_screening.quick_rows_note([_row({"dp": 2}, 1.0, 10.0, effort="full")]) == ""
