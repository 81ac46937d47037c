"""Programs built ahead (``TPUConfig(programs=DIR)``, ``diffusers-tpu compile``): written by one process, loaded by
another instead of compiled, under a key that holds everything that makes the program; anything else compiles."""

import json
import logging
import os
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from diffusers_tpu import TPUConfig
from diffusers_tpu.runtime.programs import program_store
from tests.conftest import run_fresh

RUN = """
import json, sys, numpy as np, torch, jax
import diffusers_tpu
from diffusers_tpu import TPUConfig
from diffusers_tpu.testing import tiny
builds = []
compile_ = jax.stages.Lowered.compile
jax.stages.Lowered.compile = lambda self, *a, **k: builds.append(1) or compile_(self, *a, **k)
config = TPUConfig(compile_cache_dir=False, programs={programs!r} or None)
pipe = tiny.wan_pipeline("wan").to("jax", config=config)
frames = pipe(prompt="a cat walks", negative_prompt="blurry", height=32, width=32, num_frames=9,
              num_inference_steps=2, output_type="np", generator=torch.Generator().manual_seed(0)).frames
np.save({out!r}, frames)
print(json.dumps({{"builds": len(builds)}}))
"""
SCHEDULER_PROGRAMS = 2  # FlowMatchEuler's compiled steps in a 2-step call: the first (finds its counter), the rest


@pytest.mark.slow
def test_a_folder_built_by_the_compile_command_serves_another_process_without_compiling(tmp_path):
    """Process A: ``diffusers-tpu compile --local`` (a zero-execution warm-up writing every program). Process B loads
    them all (no program compiled) and makes the frames a compiling process makes, bit for bit."""
    folder = tmp_path / "programs"
    built = run_fresh(
        f"""
        import json, os
        from diffusers_tpu.commands import cli
        code = cli.main(["compile", "--local", "--model", "tiny:wan", "--dtype", "float32", "--height", "32",
                         "--width", "32", "--frames", "9", "--steps", "2", "--output", {str(folder)!r}])
        print(json.dumps({{"code": code, "files": sorted(os.listdir({str(folder)!r}))}}))
        """
    )
    assert built["code"] == 0
    # the step, the two decode programs, and the scheduler's two steps (a schedule's first step, then the rest)
    assert sum(name.endswith(".program") for name in built["files"]) == 3 + SCHEDULER_PROGRAMS
    loading = run_fresh(RUN.format(programs=str(folder), out=str(tmp_path / "loaded.npy")))
    compiling = run_fresh(RUN.format(programs="", out=str(tmp_path / "compiled.npy")))
    assert loading["builds"] == 0 and compiling["builds"] == 3 + SCHEDULER_PROGRAMS
    assert np.array_equal(np.load(tmp_path / "loaded.npy"), np.load(tmp_path / "compiled.npy"))


def _program(x_shape=(8, 8)):
    return jax.jit(lambda x: jnp.tanh(x @ x.T) * 2).lower(jnp.ones(x_shape))


def test_a_program_runs_only_under_its_own_key(tmp_path, caplog):
    store = program_store.ProgramStore(str(tmp_path))
    lowered = _program()
    assert store.load(lowered) is None
    compiled = lowered.compile()
    assert store.save(lowered, {}, compiled)
    loaded = store.load(lowered)
    assert np.array_equal(loaded(jnp.ones((8, 8))), compiled(jnp.ones((8, 8))))
    assert store.load(_program((8, 4))) is None  # another program: its own key, nothing loaded
    assert store.load(lowered, {"exec_time_optimization_effort": -1.0}) is None  # another build of it
    # stored for another setup: compiled here, one line names what differed
    (meta_path,) = [tmp_path / n for n in os.listdir(tmp_path) if n.endswith(".json")]
    meta = json.loads(meta_path.read_text())
    meta["environment"]["jax"] = "0.0.1"
    other = program_store._digest(meta["environment"])
    module = meta_path.name.split("-")[0]
    (tmp_path / f"{module}-{other}.json").write_text(json.dumps(meta))
    meta_path.unlink()
    with caplog.at_level(logging.WARNING):
        assert store.load(lowered) is None
    assert "built for another setup (jax '0.0.1' there" in caplog.text and "compiling it here" in caplog.text


def test_flags_are_part_of_the_key(tmp_path, monkeypatch, caplog):
    store = program_store.ProgramStore(str(tmp_path))
    lowered = _program()
    store.save(lowered, {}, lowered.compile())
    monkeypatch.setenv("LIBTPU_INIT_ARGS", "--xla_tpu_some_flag=true")
    with caplog.at_level(logging.WARNING):
        assert store.load(lowered) is None
    assert "LIBTPU_INIT_ARGS" in caplog.text


def test_a_corrupt_program_is_set_aside_and_compiled(tmp_path, caplog):
    store = program_store.ProgramStore(str(tmp_path))
    lowered = _program()
    store.save(lowered, {}, lowered.compile())
    (payload,) = [tmp_path / n for n in os.listdir(tmp_path) if n.endswith(".program")]
    payload.write_bytes(payload.read_bytes()[:100])  # truncated
    with caplog.at_level(logging.WARNING):
        assert store.load(lowered) is None
    assert "set aside as .bad" in caplog.text
    assert sorted(n.rsplit(".", 1)[-1] for n in os.listdir(tmp_path)) == ["bad", "bad"]
    store.save(lowered, {}, lowered.compile())
    assert store.load(lowered) is not None  # written again, whole


def test_two_writers_leave_one_whole_program(tmp_path):
    lowered = _program()
    compiled = lowered.compile()
    stores = [program_store.ProgramStore(str(tmp_path)) for _ in range(4)]
    threads = [threading.Thread(target=store.save, args=(lowered, {}, compiled)) for store in stores]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(n.rsplit(".", 1)[-1] for n in os.listdir(tmp_path)) == ["json", "program"]  # no torn or temp file
    assert stores[0].load(lowered) is not None


def test_a_folder_that_cannot_be_written_is_read_and_the_run_goes_on(tmp_path, monkeypatch, caplog):
    lowered = _program()
    program_store.ProgramStore(str(tmp_path)).save(lowered, {}, lowered.compile())
    monkeypatch.setattr(program_store.os, "access", lambda path, mode: False)
    with caplog.at_level(logging.WARNING):
        store = program_store.ProgramStore(str(tmp_path))
    assert not store.writable and "read-only here" in caplog.text
    assert store.load(lowered) is not None and store.save(_program((4, 4)), {}, _program((4, 4)).compile()) is False
    monkeypatch.undo()

    def full_disk(path, data):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(program_store, "_write_atomically", full_disk)
    store = program_store.ProgramStore(str(tmp_path / "other"))
    with caplog.at_level(logging.WARNING):
        assert store.save(lowered, {}, lowered.compile()) is False
    assert "could not save a program" in caplog.text and "the run goes on" in caplog.text


def test_a_programs_path_that_is_a_file_is_refused_before_anything_moves(tmp_path):
    path = tmp_path / "programs"
    path.write_text("not a folder")
    with pytest.raises(ValueError, match=r"is a file, not a folder: name a folder"):
        TPUConfig(programs=str(path))
    with pytest.raises(ValueError, match="folder path or None"):
        TPUConfig(programs=3)


@pytest.mark.tpu_slow
def test_programs_built_for_a_tpu_slice_carry_its_key_and_are_not_run_here(tmp_path):
    """``compile --chips v6e-1`` on this CPU machine: every program of the call written under the key a v6e VM
    computes (TPU v6 lite devices in mesh order, libtpu's version); a CPU run finds them built for another setup and
    compiles (the TPU side of loading is untested here: no TPU)."""
    from diffusers_tpu.planner import tpu_compiler

    if not tpu_compiler.available():
        pytest.skip("libtpu (the TPU compiler) not installed")
    folder = tmp_path / "v6e"
    built = run_fresh(
        f"""
        import json, os
        from diffusers_tpu.commands import cli
        code = cli.main(["compile", "--chips", "v6e-1", "--model", "tiny:wan", "--dtype", "float32", "--height",
                         "32", "--width", "32", "--frames", "9", "--output", {str(folder)!r}])
        print(json.dumps({{"code": code}}))
        """
    )
    assert built["code"] == 0
    metas = [json.loads((folder / n).read_text()) for n in sorted(os.listdir(folder)) if n.endswith(".json")]
    assert len(metas) == 3  # the step, the two decode programs (quick: the TPU default)
    for meta in metas:
        environment = meta["environment"]
        assert environment["platform"] == "tpu" and environment["libtpu"]
        assert [device[0] for device in environment["devices"]] == ["TPU v6 lite"]
    from diffusers_tpu.interop.jax_private import QUICK_COMPILE

    assert [m["options"] for m in metas].count(QUICK_COMPILE) == 2  # the decode programs at quick effort
    loading = run_fresh(RUN.format(programs=str(folder), out=str(tmp_path / "cpu.npy")))
    # not one of them runs on the CPU; the scheduler's steps are not built ahead for a slice (milliseconds each)
    assert loading["builds"] == 3 + SCHEDULER_PROGRAMS


@pytest.mark.mesh_slow
def test_on_the_eight_device_mesh_a_second_process_loads_every_program(tmp_path):
    """dp2·sp1·tp4 over 8 simulated devices: process A runs a call with the folder (writing what it compiles),
    process B loads every program in the mesh's device order and makes the same frames, bit for bit."""
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    code = RUN.replace('tiny.wan_pipeline("wan")', 'tiny.wan_pipeline("wan-4head")').replace(
        "TPUConfig(compile_cache_dir=False,", 'TPUConfig(mesh={{"dp": 2, "sp": 1, "tp": 4}}, compile_cache_dir=False,'
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("DIFFUSERS_TPU_")}
    env.update(PYTHONPATH=root, XLA_FLAGS="--xla_force_host_platform_device_count=8")
    runs = []
    for name in ("a", "b"):
        source = code.format(programs=str(tmp_path / "programs"), out=str(tmp_path / f"{name}.npy"))
        result = subprocess.run([sys.executable, "-c", source], capture_output=True, text=True, env=env, timeout=600)
        assert result.returncode == 0, result.stderr[-3000:]
        runs.append(json.loads(result.stdout.strip().splitlines()[-1]))
    assert runs[0]["builds"] == 3 + SCHEDULER_PROGRAMS and runs[1]["builds"] == 0
    assert np.array_equal(np.load(tmp_path / "a.npy"), np.load(tmp_path / "b.npy"))
