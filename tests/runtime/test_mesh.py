"""The 8-device simulated mesh (XLA_FLAGS=--xla_force_host_platform_device_count=8), in a subprocess."""

import json
import os
import subprocess
import sys

import diffusers
import pytest

WORKER = os.path.join(os.path.dirname(os.path.dirname(__file__)), "workers", "mesh_worker.py")


def mesh_report(part: str) -> dict:
    """The JSON report of one part of ``mesh_worker.py`` (see its ``main``)."""
    result = subprocess.run([sys.executable, WORKER, part], capture_output=True, text=True, timeout=1800)
    lines = [line for line in result.stdout.splitlines() if line.startswith("REPORT ")]
    # progress bars left out; the start of stderr too (a stuck collective names every waiting device there)
    stderr = "\n".join(line for line in result.stderr.splitlines() if "it/s" not in line and "s/it" not in line)
    assert result.returncode == 0 and lines, result.stdout[-3000:] + stderr[:4000] + "\n...\n" + stderr[-6000:]
    return json.loads(lines[-1][len("REPORT ") :])


@pytest.fixture(scope="module")
def report():
    return mesh_report("core")


@pytest.fixture(scope="module")
def families():
    """CogVideoX, Wan 2.2 / I2V, HunyuanVideo-1.5 and causal Wan on meshes the parity sweep does not run (it runs
    every class on dp2·sp2·tp2): minutes, so CI's second command (``-m mesh_slow``), not README's."""
    return mesh_report("family_meshes")


def test_eight_devices(report):
    assert report["devices"] == 8


@pytest.mark.parametrize("mesh", ["dp2-sp1-tp4", "dp1-sp2-tp4", "dp2-sp2-tp2", "tp2-sp4", "dp2-sp1-tp4-jax-splash"])
def test_matches_stock_torch_on_the_mesh(report, mesh):
    run = report["runs"][mesh]
    assert run["finite"] and run["np_max_abs"] <= 1e-4, run
    assert run["pil_max_levels"] <= 1 and run["pil_fraction"] <= 1e-3, run
    assert run["warm_compilations"] == 0


@pytest.mark.parametrize("run", ["d128-dp2-sp1-tp4", "d128-tp2-sp4"])
def test_head_dim_128_packed_kernel_matches_stock_on_the_mesh(report, run):
    """Heads of 128 (the real models'): the exp2 kernel reads q/k/v as [B, S, H*D] inside each shard."""
    found = report["runs"][run]
    assert found["finite"] and found["np_max_abs"] <= 1e-4, found
    assert found["pil_max_levels"] <= 1 and found["pil_fraction"] <= 1e-3, found


def test_mesh_shapes_and_cfg_batching(report):
    runs = report["runs"]
    assert runs["dp2-sp1-tp4"]["mesh"] == {"dp": 2, "sp": 1, "tp": 4}
    assert runs["tp2-sp4"]["mesh"] == {"tp": 2, "sp": 4, "dp": 1}
    assert runs["default"]["mesh"] == {"dp": 2, "sp": 1, "tp": 4}  # 4 heads: tp=4 after dp=2
    steps = 3
    assert runs["dp2-sp1-tp4"]["batched_steps"] == steps and runs["dp2-sp2-tp2"]["batched_steps"] == steps
    assert runs["tp2-sp4"]["batched_steps"] == 0  # dp=1: no pairing by default
    assert runs["dp1-sp2-tp4"]["mesh"] == {"dp": 1, "sp": 2, "tp": 4}
    # the project's exp2 kernel is the default; JAX's splash kernel is the other Pallas option
    assert {run["attention"] for name, run in runs.items() if "jax-splash" not in name} == {"splash_exp2"}
    assert runs["dp2-sp1-tp4-jax-splash"]["attention"] == "splash"


def test_weights_are_verifiably_sharded(report):
    layout = report["runs"]["dp2-sp1-tp4"]["layout"]
    q = layout["to_q"]  # column-parallel: output features over tp
    assert q["spec"] == ["tp", "None"] and q["shard"] == [q["shape"][0] // 4, q["shape"][1]] and q["devices"] == 8
    out = layout["to_out"]  # row-parallel: input features over tp
    assert out["spec"] == ["None", "tp"] and out["shard"] == [out["shape"][0], out["shape"][1] // 4]
    assert layout["ffn_in"]["spec"] == ["tp", "None"] and layout["ffn_out"]["spec"] == ["None", "tp"]
    assert layout["cross_k"]["spec"] == ["tp", "None"]
    assert layout["patch"]["spec"] == [] and layout["patch"]["shard"] == layout["patch"]["shape"]
    assert report["runs"]["dp2-sp2-tp2"]["layout"]["to_q"]["shard"][0] == q["shape"][0] // 2


def test_int8_weights_on_the_mesh_match_one_device(report):
    import base64

    import numpy as np

    from diffusers_tpu import TPUConfig
    from diffusers_tpu.testing import tiny
    from tests.conftest import generate

    run = report["quantize"]
    assert run["finite"] and run["warm_compilations"] == 0
    layout, plain = run["layout"], report["runs"]["dp2-sp1-tp4"]["layout"]
    assert run["layout"]["dtypes"] == {"to_q": "torch.int8", "to_k": "torch.int8"}
    for name in ("to_q", "to_out", "ffn_in", "ffn_out", "cross_k", "patch"):  # sharded like the float weights
        assert layout[name]["spec"] == plain[name]["spec"] and layout[name]["shard"] == plain[name]["shard"], name
    mesh_out = np.frombuffer(base64.b64decode(run["frames"]), np.float32).reshape(run["shape"])
    pipe = tiny.wan_pipeline("wan-4head").to("jax", config=TPUConfig(quantize="int8"))
    one_device = generate(pipe, output_type="np")
    # per-channel scales are global maxima (row-parallel weights reduce over tp): the same int8 values either way
    assert np.abs(mesh_out - one_device).max() <= 1e-4


def test_back_on_torch_exactly(report):
    assert report["restored_exactly"]


def test_mesh_errors(report):
    errors = report["errors"]
    assert "2 attention heads" in errors["heads"] and "tp=4" in errors["heads"]
    assert "spans 2 devices but there are 8" in errors["product"]
    assert errors["still_on_torch"]


def test_realistic_sharded_export_for_tpu(report):
    export = report["export"]
    assert export["step_pallas"] and export["step_devices"] == 8
    assert export["step_out"] == [[2, 16, 21, 60, 104]]
    assert export["decode_devices"] == 8 and export["decode_out"] == [[1, 3, 9, 480, 832]]


@pytest.mark.parametrize("run", ["1.5-dpm-dp2-sp1-tp4", "2b-dpm-dp2-sp2-tp2", "d64-ddim-dp2-sp2-tp2"])
@pytest.mark.mesh_slow
def test_cogvideox_matches_stock_torch_on_the_mesh(families, run):
    result = families["cogvideox"][run]
    assert result["finite"] and result["np_max_abs"] <= 1e-4, result
    assert result["pil_max_levels"] <= 1 and result["pil_fraction"] <= 1e-3, result
    assert result["q_spec"] == ["tp", "None"]
    assert result["vae_width_spec"] == [None, None, None, None, "spatial"]  # width over all 8 devices, VAE mesh


@pytest.mark.parametrize("run", ["a14b", "ti2v", "i2v"])
@pytest.mark.mesh_slow
def test_wan22_and_i2v_match_stock_torch_on_the_mesh(families, run):
    result = families["wan22"][run]
    assert result["finite"] and result["np_max_abs"] <= 1e-4, result
    assert result["pil_max_levels"] <= 1 and result["pil_fraction"] <= 1e-3, result
    assert result["vae_mesh"] == {"batch": 1, "spatial": 8}
    assert result["batched_steps"] == 3  # the CFG pair as one dp-sharded batch


@pytest.mark.parametrize("run", ["dp2-sp1-tp4", "dp1-sp2-tp4"])  # dp2·sp2·tp2: the parity sweep
@pytest.mark.mesh_slow
def test_hunyuan15_matches_stock_torch_on_the_mesh(families, run):
    result = families["hunyuan15"][run]
    assert result["finite"] and result["np_max_abs"] <= 1e-4, result
    assert result["pil_max_levels"] <= 1 and result["pil_fraction"] <= 1e-3, result
    assert result["warm_compilations"] == 0
    assert result["add_q_spec"] == ["tp", "None"]


@pytest.mark.mesh_slow
def test_a_guider_for_half_the_steps_on_the_mesh(families):
    """The pair batched over dp for the guided steps, the single program after; stock's video; nothing recompiles."""
    result = families["hunyuan15"]["guided_half"]
    assert result["np_max_abs"] <= 1e-4, result
    assert result["batches"] == [2, 2, 1, 1] * 2 and result["warm_compilations"] == 0


@pytest.mark.parametrize("run", ["dp2-sp1-tp4", "dp1-sp2-tp4"])  # dp2·sp2·tp2: the parity sweep
@pytest.mark.mesh_slow
def test_causal_wan_streams_on_the_mesh(families, run):
    result = families["causal_wan"][run]
    assert result["finite"] and result["np_max_abs"] <= 1e-4, result
    assert result["pil_max_levels"] <= 1 and result["pil_fraction"] <= 1e-3, result
    compiled = result["first_call_compilations"]
    assert compiled[0] > 0 and compiled[1:] == [0, 0], compiled  # one program set serves every later block
    assert result["warm_compilations"] == 0 and result["q_spec"] == ["tp", "None"]


@pytest.mark.mesh_slow
def test_a_width_tp_does_not_divide_runs_on_the_default_mesh(families):
    """Z-Image at diffusers' test size (MLP width 85): ``pipe.to("jax")`` on 8 devices takes tp=1, and the images
    are stock's (before: a refusal naming the weight, with a mesh the user had not chosen)."""
    result = families["odd_width"]
    assert result["mesh"] == {"dp": 2, "sp": 4, "tp": 1}
    assert result["finite"] and result["np_max_abs"] <= 1e-4, result
    assert result["pil_max_levels"] <= 1 and result["pil_fraction"] <= 1e-3, result
    assert result["warm_compilations"] == 0


@pytest.mark.mesh_slow
def test_freeu_runs_its_ffts_on_the_cpu_mesh(families):
    """FreeU's Fourier filter inside the UNet step on dp2·sp2·tp2 (XLA:CPU failed any FFT it split)."""
    result = families["freeu"]
    assert result["finite"] and result["np_max_abs"] <= 1e-4, result
    assert result["pil_max_levels"] <= 1 and result["pil_fraction"] <= 1e-3, result


@pytest.mark.parametrize("run", ["dp1-sp2-tp4"])
def test_lora_on_the_mesh(report, run):
    result = report["lora"][run]
    assert result["finite"] and result["np_max_abs"] <= 1e-4, result
    assert result["weight_change_compilations"] == 0
    for adapter in ("a", "b"):  # loaded before and after the move: the same layout
        specs = {key.rsplit(".", 1)[0]: spec for key, spec in result["specs"].items() if key.endswith(adapter)}
        # column-parallel layers (q, ffn in): A replicated, B split like the output features
        assert specs["q_A"] == ["None", "None"] and specs["q_B"] == ["tp", "None"]
        assert specs["ffn_in_B"] == ["tp", "None"]
        # row-parallel layers (attention out, ffn out): A split like the input features, B replicated
        assert specs["out_A"] == ["None", "tp"] and specs["out_B"] == ["None", "None"]
        assert specs["ffn_out_A"] == ["None", "tp"]


@pytest.mark.parametrize(
    "run",
    [
        "first_block-dp2-sp1-tp4",
        "mag-dp1-sp2-tp4",
        "mag-dp2-sp2-tp2",
        "taylorseer-dp2-sp2-tp2",
        "faster-dp2-sp2-tp2",
        "sea-dp2-sp2-tp2",
    ],
)
def test_step_caches_on_the_mesh(report, run):
    """Whole-step programs (no block its own unit), the pair batched wherever dp pairs it, nothing recompiled."""
    if run not in report["caches"] and run.startswith("sea") and not hasattr(diffusers, "SeaCacheConfig"):
        pytest.skip("SeaCache is new in diffusers 0.42")
    result = report["caches"][run]
    assert result["finite"] and result["np_max_abs"] <= 1e-4, result
    assert result["warm_compilations"] == 0 and result["unit_calls"] == 0
    cache = run.split("-")[0]
    paired = not run.endswith("dp1-sp2-tp4") and cache != "faster"  # its pair: two calls (shared state)
    assert result["batched_steps"] == (6 if paired else 0)
    assert result["programs"] == {"taylorseer": 4, "sea": 3}.get(cache, 2)  # both contexts' calls share them
    # the kept state spread over the mesh: tokens over dp·sp (the size-1 axis left out), features over tp; TaylorSeer's
    # factors stacked over the layers first
    tokens = {"dp2-sp1-tp4": "'dp'", "dp1-sp2-tp4": "'sp'", "dp2-sp2-tp2": "('dp', 'sp')"}[run.split("-", 1)[1]]
    layers = "None, " if cache in ("taylorseer", "faster") else ""
    assert result["kept_specs"] == [f"P({layers}None, {tokens}, 'tp')"], result


def test_text_kv_cache_on_the_mesh(report):
    """TextKVCache on NucleusMoE-Image over dp2·sp2·tp2: stock's image, the pair batched over dp at every step though
    the loop names no contexts, the text keys and values computed once a call and kept spread over the mesh."""
    if not hasattr(diffusers, "TextKVCacheConfig"):
        pytest.skip("TextKVCache is new in diffusers 0.42")
    result = report["caches"]["text_kv-dp2-sp2-tp2"]
    assert result["finite"] and result["np_max_abs"] <= 1e-4, result
    assert result["warm_compilations"] == 0 and result["unit_calls"] == 0 and result["programs"] == 2
    assert result["batched_steps"] == 4 and result["computing_calls"] == 2  # one a call, two calls
    assert result["kept_specs"] == ["P(None, 'dp', 'sp', 'tp')"], result  # layers, rows, text, heads


def test_faster_cache_where_the_pipeline_batches_the_pair_keeps_dp(report):
    """CogVideoX concatenates the guidance pair in its one call: under FasterCache (whose state keeps a two-call pair
    as two calls) the automatic mesh still splits that batch over dp; stock's video from whole-step programs."""
    result = report["caches"]["faster-cogvideox-auto"]
    assert result["mesh"]["dp"] == 2 and result["finite"] and result["np_max_abs"] <= 1e-4, result
    assert result["warm_compilations"] == 0 and result["unit_calls"] == 0 and result["programs"] == 2


# --- a 2-host "pod": 2 processes x 4 devices on jax.distributed (gloo), launched through the environment -------------
def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch_processes(script: str, args: list, count: int = 2, timeout: float = 1500) -> list:
    """Run ``count`` processes of ``script`` as one JAX cluster; returns their (returncode, stdout, stderr). Every
    process is killed (with its children) on a timeout or an error, so nothing outlives the test."""
    import signal

    port = _free_port()
    processes = []
    try:
        for index in range(count):
            env = dict(
                os.environ,
                DIFFUSERS_TPU_COORDINATOR=f"127.0.0.1:{port}",
                DIFFUSERS_TPU_NUM_PROCESSES=str(count),
                DIFFUSERS_TPU_PROCESS_ID=str(index),
            )
            processes.append(
                subprocess.Popen(
                    [sys.executable, script, *args],
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                    start_new_session=True,
                )
            )
        return [(p.returncode, *p.communicate(timeout=timeout)) for p in processes]
    finally:
        for process in processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


@pytest.fixture(scope="module")
def pod(tmp_path_factory):
    worker = os.path.join(os.path.dirname(os.path.dirname(__file__)), "workers", "multihost_worker.py")
    directory = str(tmp_path_factory.mktemp("pod"))
    results = launch_processes(worker, [directory])
    reports = []
    for code, out, err in results:
        lines = [line for line in out.splitlines() if line.startswith("REPORT ")]
        assert lines, out[-3000:] + err[-6000:]
        reports.append(json.loads(lines[-1][len("REPORT ") :]))
    return reports, directory


def _frames(entry):
    import base64

    import numpy as np

    return np.frombuffer(base64.b64decode(entry["frames"]), dtype=np.float32).reshape(entry["shape"])


@pytest.mark.mesh_slow  # two 4-device processes start JAX and run four pipelines: ~2 minutes
def test_two_processes_form_one_mesh_and_match_one_process(report, pod):
    """2 processes x 4 devices = 1 process x 8 devices = torch, for Wan T2V and LTX-Video on both layouts; each
    process ends with the whole video; processes given different seeds get an error, not a mixed video."""
    import numpy as np

    reports, directory = pod
    assert [r["process"] for r in reports] == [0, 1]
    assert all(r["processes"] == 2 and r["devices"] == 8 and r["local_devices"] == 4 for r in reports)
    for mesh in ("dp2-sp1-tp4", "dp1-sp2-tp4"):
        for r in reports:
            assert r[f"wan-{mesh}"]["np_max_abs"] <= 1e-4 and r[f"ltx-{mesh}"]["np_max_abs"] <= 1e-4, r
            assert r[f"wan-{mesh}"]["warm_compilations"] == 0
        assert reports[0][f"wan-{mesh}"]["np_max_abs"] == reports[1][f"wan-{mesh}"]["np_max_abs"]
        single = report["runs"][mesh]
        assert np.abs(_frames(reports[0][f"wan-{mesh}"]) - _frames(single)).max() <= 1e-5
    assert [(r["agreed_limit"], r["agreed_none"]) for r in reports] == [(50, None), (50, None)]
    for r in reports:  # text encoders compiled on the pod's devices
        assert r["wan-encoders-on-devices"]["placement"] == "jax"
        assert r["wan-encoders-on-devices"]["np_max_abs"] <= 1e-4, r["wan-encoders-on-devices"]
    assert all("disagree on a pipeline input" in r["disagreement"] for r in reports), reports[0]["disagreement"]
    assert all(r["loading_equal"] for r in reports)  # sharded loading = stock loading + .to(), shard by shard
    assert [r["cli"]["code"] for r in reports] == [0, 0] and reports[0]["cli"]["wrote"]
    assert sorted(os.listdir(directory)) == ["checkpoint-0", "checkpoint-1", "stages", "video.mp4"]  # no partial files


def test_fully_sharded_weights_on_the_mesh(report):
    """``TPUConfig(fully_sharded_weights=True)``: stacks stored over dp and sp too (about a quarter per device
    on dp2·sp2·tp2), each layer used with its tensor-parallel sharding; the other weights stored over all devices; the
    video equals stock, no warm compile."""
    run = report["fully_sharded"]
    assert run["np_max_abs"] <= 1e-4 and run["warm_compilations"] == 0
    assert run["is_view"] and run["state_dict_exact"] and run["restored_exactly"]
    # at least dp·sp = 4 times less per device (replicated norms split 8 ways; a shape no axis divides stays whole)
    assert run["stack_bytes_per_device"]["full"] * 3.5 <= run["stack_bytes_per_device"]["rules"]
    assert "tp" in run["layer_spec"] and not any("dp" in e for e in run["layer_spec"])
    assert any("dp" in e and "sp" in e for e in run["stack_spec"])
    assert run["embedder_shards"] == 8  # an unstacked weight (replicated by the rules) stored in eight pieces


def test_model_offload_on_the_mesh(report):
    run = report["model_offload"]
    assert run["max_abs"] <= 1e-4 and run["repeat_equal"] and run["warm_compilations"] == 0
    assert set(run["devices_after_call"].values()) == {"cpu"}  # every component back on the host after the call


def test_context_parallel_configs_become_the_mesh(report):
    """A multi-GPU script's ``enable_parallelism(ContextParallelConfig(...))``: Ulysses x ring degrees as ``sp``,
    the same video; degrees the devices cannot hold refused first (the pipeline stays where it was), and the fix the
    error suggests works."""
    run = report["context_parallel"]
    assert "no (dp, sp, tp) mesh has those degrees" in run["refused"], run
    assert run["mesh_after_refusal"] == {"dp": 2, "sp": 1, "tp": 4}
    assert run["suggested_mesh"]["sp"] == 8 and run["suggested_max_abs"] <= 1e-4, run
    assert run["mesh"] == {"dp": 2, "sp": 4, "tp": 1} and run["max_abs"] <= 1e-4, run
    assert run["back_on_torch"]


def test_sequential_offload_on_the_mesh(report):
    run = report["sequential_offload"]
    assert run["max_abs"] <= 1e-4 and run["repeat_equal"] and run["warm_compilations"] == 0, run
    assert set(run["devices_after_call"].values()) == {"meta"}, run  # stock's offloaded modules show meta tensors
    assert run["stack_memory_kind"] == "pinned_host" and "tp" in run["stack_spec"], run  # sharded as decided
    assert run["group_max_abs"] <= 1e-4, run  # group offloading on the same mesh
