"""Faults, broken on purpose as a user would: every one ends with a clear error in bounded time, the previous outputs
bit-identical and nothing half-written (docs/faults.md)."""

import json
import os
import re
import resource
import shlex
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

import diffusers_tpu
from diffusers_tpu.commands import cli
from diffusers_tpu.runtime.files import outputs, stages
from diffusers_tpu.runtime.weights import loading
from diffusers_tpu.testing import tiny

CLI = [sys.executable, "-m", "diffusers_tpu.commands.cli"]
SMALL = ["--height", "32", "--width", "32", "--frames", "9", "--steps", "2"]


@pytest.fixture(autouse=True)
def _platform_restored(monkeypatch):
    """``--platform cpu`` in an in-process ``cli.main`` sets DIFFUSERS_TPU_PLATFORM: restored after each test, so
    later subprocesses of this worker see the environment they expect."""
    monkeypatch.setenv("DIFFUSERS_TPU_PLATFORM", "")  # recorded as unset, so the teardown removes it again
    monkeypatch.delenv("DIFFUSERS_TPU_PLATFORM")


def _listing(folder) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


# --- outputs ------------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_full_disk_keeps_the_previous_video_and_fails(tmp_path):
    """A file-size limit (as a full disk, also for root): ffmpeg's failure is caught, exit 1 naming the OS error, the
    old video bit-identical, no temporary file, no success message."""
    video = tmp_path / "video.mp4"
    video.write_bytes(b"the good video from before" * 100)
    before = video.read_bytes()

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (2048, 2048))

    result = subprocess.run(
        [*CLI, "generate", *SMALL, "--platform", "cpu", "--output", str(video)],
        capture_output=True,
        text=True,
        timeout=600,
        preexec_fn=limit,
        env={**os.environ, "JAX_ENABLE_COMPILATION_CACHE": "false"},
    )
    assert result.returncode == 1, (result.stdout[-2000:], result.stderr[-3000:])
    assert "File too large" in result.stderr and "previous file there is unchanged" in result.stderr
    assert "wrote" not in result.stdout
    assert video.read_bytes() == before and _listing(tmp_path) == ["video.mp4"]


@pytest.mark.parametrize(
    "output, message",
    [
        ("/proc/diffusers-tpu-nowhere/video.mp4", "cannot be written"),  # no one may create files there, root included
        ("{tmp}/notes.txt/video.mp4", "is a file, not a folder"),
        ("{tmp}", "is a folder; give a file name"),
    ],
)
def test_unwritable_destinations_exit_2_before_loading(tmp_path, capsys, output, message):
    (tmp_path / "notes.txt").write_text("a file where a folder would be")
    output = output.format(tmp=tmp_path)
    start = time.perf_counter()
    assert cli.main(["generate", "--platform", "cpu", "--output", output]) == 2
    captured = capsys.readouterr()
    assert message in captured.err and output in captured.err and "loaded" not in captured.out
    assert time.perf_counter() - start < 10  # nothing loaded or compiled
    assert _listing(tmp_path) == ["notes.txt"]
    # JSON reports and stage folders are checked the same way, before anything runs
    assert cli.main(["bench", "--platform", "cpu", "--json", output]) == 2
    assert message in capsys.readouterr().err
    if not os.path.isdir(output):  # a stage folder must be a folder
        assert cli.main(["generate", "--platform", "cpu", "--stage-dir", output, "--stop-after", "encode"]) == 2
        assert "--stage-dir" in capsys.readouterr().err
    assert _listing(tmp_path) == ["notes.txt"]


_SLOW_WRITER = """
import signal, sys, time
# Ctrl-C as in a terminal: a shell that started the suite in the background leaves SIGINT ignored in its children
signal.signal(signal.SIGINT, signal.default_int_handler)
from diffusers_tpu.runtime.files import outputs
def write(temp):
    open(temp, "wb").write(b"half a video")
    print("writing", flush=True)
    time.sleep(60)
outputs.write_atomically(sys.argv[1], write)
"""


# SIGINT: KeyboardInterrupt, then re-raised
@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, -signal.SIGINT)])
def test_a_signal_while_writing_leaves_no_partial_file(tmp_path, sig, code):
    path = tmp_path / "video.mp4"
    path.write_bytes(b"previous video")
    writer = subprocess.Popen(
        [sys.executable, "-c", _SLOW_WRITER, str(path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert writer.stdout.readline().strip() == "writing"
    assert any(p.name.startswith(".partial-") for p in tmp_path.iterdir())
    writer.send_signal(sig)
    assert writer.wait(timeout=30) == code
    assert path.read_bytes() == b"previous video" and _listing(tmp_path) == ["video.mp4"]


def test_verified_writers_refuse_a_short_file(tmp_path):
    """The check after writing: a video with fewer frames than given (an encoder that stopped early) is refused."""
    path = tmp_path / "clip.mp4"
    path.write_bytes(b"previous")
    frames = [np.full((16, 16, 3), i * 20, np.uint8) for i in range(6)]
    import diffusers.utils

    stock = diffusers.utils.export_to_video
    try:
        diffusers.utils.export_to_video = lambda f, out, fps: stock(f[:3], out, fps=fps)
        with pytest.raises(outputs.OutputError, match="holds 3 of 6 frames"):
            outputs.write_video(frames, str(path), fps=8)
    finally:
        diffusers.utils.export_to_video = stock
    assert path.read_bytes() == b"previous" and _listing(tmp_path) == ["clip.mp4"]
    outputs.write_video(frames, str(path), fps=8)
    assert _listing(tmp_path) == ["clip.mp4"] and path.stat().st_size > 100


# --- stages, the memory check: one tiny pipeline on the devices ------------------------------------------------------

SIZES = dict(height=32, width=32, num_frames=9, num_inference_steps=2)


@pytest.fixture(scope="module")
def pipe():
    return tiny.wan_pipeline("wan").to("jax")


def test_a_deleted_stage_file_is_remade_by_the_command_the_error_names(pipe, tmp_path):
    prompts = dict(prompt=tiny.WAN_CALL["prompt"], negative_prompt=tiny.WAN_CALL["negative_prompt"])
    stages.generate(pipe, tmp_path, seed=0, stop_after="denoise", **prompts, **SIZES)
    reference = stages.decode(pipe, tmp_path)
    (tmp_path / "latents.safetensors").unlink()
    with pytest.raises(stages.StageError, match="latents.safetensors was deleted; run the denoise stage") as error:
        stages.decode(pipe, tmp_path)
    command = re.search(r"CLI: (diffusers-tpu denoise --stage-dir \S+?)\)", str(error.value)).group(1)
    assert shlex.split(command)[3] == str(tmp_path)
    stages.denoise(pipe, tmp_path, seed=0, **SIZES)  # the Python form of the named command
    np.testing.assert_array_equal(stages.decode(pipe, tmp_path), reference)


def test_a_call_that_cannot_fit_is_refused_before_allocating(pipe):
    from diffusers_tpu.runtime.attach import pipeline_runtime

    start = time.perf_counter()
    with pytest.raises(ValueError, match=r"take \d+\.\d GB decoded.*more than the .* GB of memory.*diffusers-tpu plan"):
        pipe(prompt="a cat", height=100000, width=100000, num_frames=9, num_inference_steps=2)
    assert time.perf_counter() - start < 5  # nothing allocated, nothing compiled
    assert pipeline_runtime.is_attached(pipe)
    frames = pipe(prompt="a cat", **SIZES, output_type="np", generator=torch.Generator().manual_seed(0)).frames
    assert frames.shape[1:] == (9, 32, 32, 3) and np.isfinite(frames).all()  # still usable


# --- loading -----------------------------------------------------------------------------------------------------


def test_a_damaged_name_in_a_shard_header_names_the_shard(tmp_path):
    tiny.wan_pipeline("wan-4head").save_pretrained(tmp_path, max_shard_size="20KB")
    folder = tmp_path / "transformer"
    index = json.loads((folder / "diffusion_pytorch_model.safetensors.index.json").read_text())
    name, shard = sorted(index["weight_map"].items())[3]
    data = (folder / shard).read_bytes()
    header = data[8 : 8 + int.from_bytes(data[:8], "little")]
    damaged = name[:-3] + "XYZ"  # same length: only the header's text changes
    assert header.count(name.encode()) == 1
    (folder / shard).write_bytes(data[:8] + header.replace(name.encode(), damaged.encode()) + data[8 + len(header) :])
    with pytest.raises(loading.CheckpointError) as error:
        diffusers_tpu.from_pretrained(str(tmp_path), device="jax")
    message = str(error.value)
    assert name in message and shard in message and damaged in message


# --- pods: each failure a clear error within a bounded time ---------------------------------------------------------

_POD = """
import os, sys, time
import diffusers_tpu, jax
print("joined", flush=True)
if jax.process_index() == int(os.environ.get("DIE", "-1")):
    os._exit(3)
time.sleep(120)
"""


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _process(port, count, index, **env):
    environment = {
        **os.environ,
        "JAX_PLATFORMS": "cpu",
        "DIFFUSERS_TPU_COORDINATOR": f"localhost:{port}",
        "DIFFUSERS_TPU_NUM_PROCESSES": str(count),
        "DIFFUSERS_TPU_PROCESS_ID": str(index),
        **env,
    }
    return subprocess.Popen(
        [sys.executable, "-c", _POD], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environment
    )


def _exit_times(processes, timeout) -> list[float]:
    """When each process ended (time.time()), polled; their pipes are read by then (small outputs)."""
    ended, deadline = [None] * len(processes), time.time() + timeout
    while None in ended and time.time() < deadline:
        for i, process in enumerate(processes):
            if ended[i] is None and process.poll() is not None:
                ended[i] = time.time()
        time.sleep(0.1)
    assert None not in ended, "a process did not end in time"
    return ended


def _finish(process):
    out, err = process.communicate(timeout=10)
    return process.returncode, out, err


@pytest.mark.slow
def test_pod_failures_are_named_in_bounded_time():
    """Three clusters side by side: three processes expected but two started; a coordinator port already taken; a
    process that dies after joining."""
    busy = socket.socket()
    busy.bind(("0.0.0.0", 0))
    busy.listen()
    missing_port, dying_port = _free_port(), _free_port()
    short = {"DIFFUSERS_TPU_INIT_TIMEOUT": "8", "DIFFUSERS_TPU_HEARTBEAT_TIMEOUT": "5"}
    missing = [_process(missing_port, 3, i, **short) for i in range(2)]
    taken = _process(busy.getsockname()[1], 2, 0, **short)
    dying = [_process(dying_port, 2, i, DIE="1", **short) for i in range(2)]
    try:
        ended = _exit_times([*missing, taken, *dying], timeout=120)
        code, _, err = _finish(taken)
        assert (
            code != 0 and "already in use" in err and "DIFFUSERS_TPU_COORDINATOR" in err and "Segmentation" not in err
        )
        for process in missing:
            code, out, err = _finish(process)
            assert code == 1 and "joined" not in out
            assert (
                "DIFFUSERS_TPU_NUM_PROCESSES=3 processes were expected" in err and "DIFFUSERS_TPU_INIT_TIMEOUT" in err
            )
        assert _finish(dying[1])[0] == 3
        code, out, err = _finish(dying[0])
        assert "joined" in out and code == 1 and ended[4] - ended[3] < 5 + 10  # the heartbeat timeout, and a margin
        assert "process 1 of 2 stopped (no heartbeat for 5 s" in err and "DIFFUSERS_TPU_HEARTBEAT_TIMEOUT" in err
    finally:
        busy.close()
        for process in [*missing, taken, *dying]:
            process.kill()
