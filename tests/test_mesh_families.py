"""The 8-device simulated mesh, second part (``mesh_worker.py families``): issue 14's pipelines and ``plan``. A file
of its own so that pytest-xdist runs it beside test_mesh.py's part instead of after it."""

import pytest
from test_mesh import mesh_report


@pytest.fixture(scope="module")
def report():
    return mesh_report("families")


def test_plan_matches_the_runtime_program_on_the_mesh(report):
    run = report["plan"]
    assert run["planned"]["cfg_batch"] == 2 and run["planned"]["mesh"] == {"dp": 2, "sp": 1, "tp": 4}
    for key in ("argument_bytes", "output_bytes", "alias_bytes", "temp_bytes", "peak_bytes"):
        assert run["planned"][key] == run["actual"][key], (key, run)
    # both VAE decode programs are spatially sharded: each device holds an eighth of the pixels and feature cache
    # (the first program was once replicated by XLA's partitioner)
    for program in ("decode_first", "decode_chunk"):
        mesh, one = run["vae"]["8"][program], run["vae"]["1"][program]
        assert mesh["output_bytes"] <= one["output_bytes"] / 4, (program, mesh, one)
    # and CogVideoX's decoder programs (their outputs, the carried conv cache among them, were once replicated)
    mesh, one = run["cogvideox_vae"]["8"], run["cogvideox_vae"]["1"]
    assert len(mesh) == len(one) == 2
    for on_mesh, alone in zip(mesh, one):
        assert on_mesh["output_bytes"] <= alone["output_bytes"] / 4, (on_mesh, alone)



FAMILIES_14 = {"latte": "generic", "wan-v2v": "wan", "wan-vace": "wan", "skyreels-v2": "wan", "skyreels-v2-df": "wan",
               "ltx": "ltx", "hunyuan-video": "hunyuanvideo", "flux": "flux", "qwen-image": "qwenimage",
               "z-image": "zimage", "hunyuanvideo15-i2v": "hunyuanvideo15", "ltx2": "ltx2", "easyanimate": "generic",
               "sdxl": "unet", "svd": "unet", "animatediff": "unet"}
PAIRED = {"wan", "hunyuanvideo", "flux", "qwenimage", "hunyuanvideo15"}  # families that batch the CFG pair over dp themselves


@pytest.mark.parametrize("run", ["latte-dp1-sp2-tp4", "wan-v2v-dp2-sp1-tp4", "wan-vace-dp1-sp2-tp4",
                                 "skyreels-v2-dp2-sp1-tp4", "skyreels-v2-df-dp1-sp2-tp4", "ltx-dp2-sp1-tp4",
                                 "hunyuan-video-dp1-sp2-tp4", "flux-dp2-sp1-tp4", "qwen-image-dp1-sp2-tp4",
                                 "z-image-dp2-sp1-tp4", "hunyuanvideo15-i2v-dp2-sp1-tp4", "ltx2-dp1-sp2-tp4",
                                 "easyanimate-dp2-sp1-tp4", "sdxl-dp1-sp2-tp4", "svd-dp2-sp1-tp4",
                                 "animatediff-dp2-sp1-tp4"])
def test_issue_14_pipelines_on_the_mesh(report, run):
    result = report["families_14"][run]
    assert result["finite"] and result["np_max_abs"] <= 1e-4, result
    assert result["pil_max_levels"] <= 1 and result["pil_fraction"] <= 1e-3, result
    assert result["warm_compilations"] == 0
    assert result["q_spec"] == ["tp", "None"]  # inferred (generic) or from the family table: whole heads over tp
    family = FAMILIES_14[run.rsplit("-dp", 1)[0]]
    assert result["family"] == family
    if family == "ltx2":
        assert result["audio_max_abs"] <= 1e-4, result
    if family in PAIRED:
        assert (result["batched_steps"] > 0) == ("dp2" in run)  # the CFG pair as one batch over dp=2
