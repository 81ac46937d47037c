"""The parity sweep and what it decides: ``supported_pipelines()``'s statuses, the generated page, README's table,
the refusal of a class measured differing from stock. ``-m sweep`` (CI's second command) runs the sweep itself
and checks that every row of the committed table still holds."""

import json
import logging
from pathlib import Path

import numpy as np
import pytest
import torch

import diffusers_tpu
from diffusers_tpu.runtime import support
from diffusers_tpu.testing import tiny
from tests import call_depth
from tests.sweep import recipes as sweep_recipes
from tests.sweep import run as sweep

ROOT = Path(__file__).resolve().parents[1]


def test_every_row_has_a_recipe_and_the_generated_pages_are_current():
    rows = support.measured()
    assert set(rows) <= set(sweep_recipes.RECIPES)
    assert set(sweep_recipes.RECIPES) <= set(rows), "run: python -m tests.sweep.run --write"
    assert (ROOT / "docs" / "verified-pipelines.md").read_text() == support.support_page(), (
        "run: python -m tests.sweep.run --write"
    )
    readme = (ROOT / "README.md").read_text()
    assert support.readme_table() in readme, "run: python -m tests.sweep.run --write"


def test_statuses_follow_the_measurements():
    table = diffusers_tpu.supported_pipelines()
    rows = support.measured()
    for name, row in rows.items():
        if row["status"].startswith("verified"):
            assert table[name] == row["status"]
            eight_bit = "levels_off_1" in row  # the pipeline rounds its own frames: ≤ 0.1% of subpixels one level off
            assert row["max_abs_1"] <= sweep.TOLERANCE or eight_bit and row["levels_off_1"] <= 1e-3
            if row["status"] == "verified":
                assert row["max_abs_mesh"] <= sweep.TOLERANCE or eight_bit and row["levels_off_mesh"] <= 1e-3
            # rows measured since the sweep records them: a second call compiled nothing, on 1 device and the mesh;
            # pictures' "pil" within one level of stock on <= 0.1% of subpixels
            assert row.get("warm_compilations", 0) == 0, name
            for side in ("1", "mesh"):
                assert (row.get(f"pil_levels_off_{side}") or 0.0) <= 1e-3, name
    assert table["WanPipeline"] == "verified"
    assert table["WanModularPipeline"] == "unsupported: a modular pipeline; use WanPipeline"
    never_swept = next(n for n, p in support.registry.pipeline_paths().items() if p == "generic" and n not in rows)
    assert table[never_swept].startswith("untested: runs on the generic path")
    assert table["ScoreSdeVePipeline"].startswith("untested: runs on the unet path")
    assert table["FluxPriorReduxPipeline"] == "unsupported: no transformer or UNet denoiser"
    videos = [n for n, r in rows.items() if r["video"] and r["status"] == "verified on 1 device"]
    assert videos == [], f"video pipelines verified on 1 device only: {videos}"


def test_status_words():
    one, mesh = dict(max_abs=2e-6), dict(max_abs=3e-6)
    assert sweep.status_of(one, mesh, True) == ("verified", "")
    assert sweep.status_of(one, None, False) == ("verified on 1 device", "")
    assert sweep.status_of(one, dict(max_abs=0.3), True)[0] == "unsupported"
    assert sweep.status_of(dict(max_abs=None, finite=False), mesh, True)[0] == "unsupported"
    assert sweep.status_of(dict(error="recipe: TypeError: x"), None, True) == ("untested", "recipe: TypeError: x")
    assert sweep.status_of(one, dict(error="jax: ValueError: y"), True)[0] == "unsupported"
    pil = dict(one, pil_max_levels=1, pil_levels_off=5e-4)
    assert sweep.close_enough(pil) and sweep.close_enough(dict(one, audio_max_abs=3e-5))
    assert not sweep.close_enough(dict(pil, pil_max_levels=2))  # a subpixel two levels off
    assert not sweep.close_enough(dict(pil, pil_levels_off=2e-3))  # one level on more than 0.1%
    assert not sweep.close_enough(dict(one, pil_error="TypeError: not 8-bit images"))
    assert not sweep.close_enough(dict(one, audio_max_abs=None))
    assert not sweep.close_enough(dict(one, audio_max_abs=1e-3))
    assert "pil: 2 levels" in sweep.status_of(one, dict(pil, pil_max_levels=2), True)[1]
    ignored = dict(one, pil_ignored=True, pil_max_abs=1e-6)  # stock too gives float frames for "pil"
    assert sweep.close_enough(ignored) and not sweep.close_enough(dict(ignored, pil_max_abs=1e-3))


def test_a_pil_call_giving_float_frames_is_held_against_stocks_own_pil_call():
    import numpy as np

    frames = np.random.default_rng(0).random((3, 8, 8, 3), dtype=np.float32)

    class Stock:  # back on torch after ``to("cpu")``: "pil" answered with float frames, or with 8-bit pictures
        def __init__(self, honours_pil):
            self.honours_pil, self.device = honours_pil, "jax"

        def to(self, device):
            self.device = device

        def __call__(self, output_type, generator, **call):
            assert self.device == "cpu"
            return [(frames * 255).astype(np.uint8) if self.honours_pil and output_type == "pil" else frames]

    assert sweep._ignores_pil(frames, frames) and not sweep._ignores_pil((frames * 255).astype(np.uint8), frames)
    found = sweep.stock_pil(Stock(honours_pil=False), {}, frames + 2e-7)
    assert found["pil_ignored"] and found["pil_max_abs"] < 1e-6
    assert "pil_error" in sweep.stock_pil(Stock(honours_pil=True), {}, frames)


def test_outputs_are_compared_absolutely_in_0_1_and_relative_to_their_magnitude_beyond():
    import numpy as np

    image = np.linspace(0.0, 1.0, 12, dtype=np.float32)
    absolute = sweep.compare(image, image + 2e-4)
    assert "scale" not in absolute and abs(absolute["max_abs"] - 2e-4) < 1e-6
    assert sweep.status_of(sweep.compare(image, image + 2e-4), None, False)[0] == "unsupported"
    hdr = image * 50.0  # linear light: float32's last bit is 50 times an image's
    relative = sweep.compare(hdr, hdr + 1.5e-4)
    assert relative["scale"] == 50.0 and relative["max_abs"] < sweep.TOLERANCE
    assert sweep.compare(hdr, hdr + 1e-2)["max_abs"] > sweep.TOLERANCE
    assert sweep.compare(image, image * np.nan)["max_abs"] is None
    frames = np.round(image * 255.0) / 255.0  # rounded to 8 bits by the pipeline itself
    nudged = frames.copy()
    nudged[3] += 1 / 255.0
    assert sweep.close_enough(sweep.compare(np.tile(frames, 100), np.concatenate([nudged, np.tile(frames, 99)])))
    assert not sweep.close_enough(sweep.compare(frames, nudged))  # one subpixel in 12: over 0.1%


def test_a_class_measured_differing_is_refused_before_anything_moves(monkeypatch):
    pipe = tiny.wan_pipeline("wan-4head")
    rows = dict(
        support.measured(),
        WanPipeline=dict(
            status="unsupported",
            why="differs from stock on 1 device (max-abs 0.5)",
            max_abs_1=0.5,
            max_abs_mesh=None,
            video=True,
        ),
    )
    monkeypatch.setattr(support, "measured", lambda: rows)
    with pytest.raises(ValueError, match="differs from stock on 1 device .* Keep it on a torch device"):
        pipe.to("jax")
    assert all(type(p) is torch.nn.Parameter and p.device.type == "cpu" for p in pipe.transformer.parameters())
    # what the error says: it keeps working on torch
    out = pipe(
        prompt="a cat",
        height=16,
        width=16,
        num_frames=5,
        num_inference_steps=1,
        output_type="np",
        generator=torch.Generator().manual_seed(0),
    ).frames
    assert np.isfinite(out).all()


def test_an_untested_class_warns_once(caplog, monkeypatch):
    monkeypatch.setattr(support, "_warned", set())
    monkeypatch.setattr(support, "measured", lambda: {})
    with caplog.at_level(logging.WARNING, logger="diffusers_tpu"):
        for _ in range(2):
            support.check(tiny.wan_pipeline("wan-4head"), "wan")
    warnings = [r.getMessage() for r in caplog.records if "not been compared" in r.getMessage()]
    assert len(warnings) == 1 and "WanPipeline runs on the wan family file" in warnings[0]


CI_SWEEP_SECONDS = 720  # CI's part: about 12 minutes of the whole sweep's recorded time (all of it: ~50 minutes)


def test_the_ci_sample_covers_every_path_within_its_time_and_changes_with_the_commit():
    names, paths = sorted(sweep_recipes.RECIPES), support.registry.pipeline_paths()
    part = sweep.sample(names, CI_SWEEP_SECONDS, "abc", paths)
    assert part == sweep.sample(names, CI_SWEEP_SECONDS, "abc", paths)  # one commit, one sample
    assert part != sweep.sample(names, CI_SWEEP_SECONDS, "abd", paths)
    assert {paths[n].split(":")[0] for n in part} == {paths[n].split(":")[0] for n in names}
    cost = sweep.estimated_seconds(names)
    one_per_path = len({paths[n].split(":")[0] for n in names}) * max(cost.values())
    assert CI_SWEEP_SECONDS * 0.8 < sum(cost[n] for n in part) <= CI_SWEEP_SECONDS + one_per_path
    assert len(part) < len(names) / 2


def test_processes_sharing_a_claims_folder_take_each_class_once(tmp_path):
    taken = [[n for n in ("A", "B", "C") if sweep._claim(str(tmp_path), n)] for _ in range(2)]
    assert taken == [["A", "B", "C"], []]
    assert sweep._claim(None, "A")


@pytest.mark.sweep
def test_the_sweep_confirms_the_table():
    """Runs a part of the recipes drawn from the commit (every denoiser path; ``DIFFUSERS_TPU_SWEEP=all``: every
    recipe) on 1 device and the mesh, and checks each of their committed rows."""
    import os

    committed = json.loads(support.TABLE.read_text())
    names = sorted(sweep_recipes.RECIPES)
    if os.environ.get("DIFFUSERS_TPU_SWEEP") != "all":
        names = sweep.sample(names, CI_SWEEP_SECONDS, sweep.commit_key(), support.registry.pipeline_paths())
    measured = sweep.table(sweep.sweep(names))
    changed = {
        name: (committed.get(name, {}).get("status"), row["status"], row["why"])
        for name, row in measured.items()
        if committed.get(name, {}).get("status") != row["status"]
    }
    assert changed == {}, changed
    # what the status does not say: a second call compiles nothing; the CFG pair runs as one batch over dp as the
    # committed row recorded it (rows measured before the sweep recorded it carry none: the next --write adds it)
    recompiled = {
        name: row["warm_compilations"]
        for name, row in measured.items()
        if row["status"].startswith("verified") and row["warm_compilations"]
    }
    assert recompiled == {}, recompiled
    deep = {name: row["deepest_frames"] for name, row in measured.items() if row["deepest_frames"] > call_depth.MOST}
    assert deep == {}, f"more than {call_depth.MOST} of the project's frames between stock code and a program: {deep}"
    drifted = {
        name: (committed[name]["batched_steps_mesh"], row["batched_steps_mesh"])
        for name, row in measured.items()
        if "batched_steps_mesh" in committed[name]
        and committed[name]["batched_steps_mesh"] != row["batched_steps_mesh"]
    }
    assert drifted == {}, drifted


def test_a_pil_call_raising_is_left_out_only_when_stock_raises_the_same():
    class Stock:
        def __init__(self, message):
            self.message = message

        def to(self, device):
            self.device = device

        def __call__(self, output_type, generator, **call):
            assert self.device == "cpu"
            raise TypeError(self.message)

    raised = TypeError("Cannot handle this data type: (1, 1, 1), <u2")
    assert "pil_stock_fails" in sweep.stock_pil_fails(Stock(str(raised)), {}, raised)
    assert sweep.stock_pil_fails(Stock("another"), {}, raised) == {}
