"""Ctrl-C stops ``diffusers-tpu generate`` wherever it lands: exit 130, no partial file, the previous output unchanged.

A real Ctrl-C during a compile often lands in JAX's garbage-collector callback, where CPython drops the
KeyboardInterrupt (``interop.interrupts``); ``tests/workers/interrupt_worker.py`` makes that happen on purpose."""

import os
import re
import select
import signal
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.slow  # a process each, ~15 s: CI's second command (setup.cfg)

WORKER = os.path.join(os.path.dirname(os.path.dirname(__file__)), "workers", "interrupt_worker.py")
STEPS = 200


def _command(output) -> list[str]:
    return ["generate", "--output", str(output), "--steps", str(STEPS), "--platform", "cpu"]


def _environment(tmp_path) -> dict:
    # a cache of its own: the first step's program really compiles
    return {**os.environ, "DIFFUSERS_TPU_CACHE_DIR": str(tmp_path / "cache"), "JAX_PLATFORMS": "cpu"}


def _previous(tmp_path):
    output = tmp_path / "out" / "video.mp4"
    output.parent.mkdir()
    output.write_bytes(b"the previous video")
    return output


def _left_as_it_was(output) -> bool:
    return output.read_bytes() == b"the previous video" and os.listdir(output.parent) == ["video.mp4"]


@pytest.mark.parametrize("moment", ["compile", "loop"])
def test_a_ctrl_c_python_drops_still_stops_the_run_within_a_step(tmp_path, moment):
    output = _previous(tmp_path)
    result = subprocess.run(
        [sys.executable, WORKER, moment, *_command(output)],
        capture_output=True,
        text=True,
        timeout=600,
        env=_environment(tmp_path),
    )
    assert "dropped after step" in result.stderr, result.stderr[-3000:]  # the drop happened, as a real one does
    steps_after = [line for line in result.stderr.splitlines() if line.startswith("step ")]
    assert result.returncode == 130, (result.returncode, result.stderr[-3000:])
    assert len(steps_after) <= 1, steps_after  # stopped within the step it landed in
    assert "interrupted" in result.stderr and "video.mp4 was not written" in result.stderr
    assert _left_as_it_was(output)


def _read_until(process, pattern: str, seen: list, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not re.search(pattern, "".join(seen)):
        assert time.monotonic() < deadline and process.poll() is None, "".join(seen)[-3000:]
        ready, _, _ = select.select([process.stderr], [], [], 0.1)
        if ready:
            seen.append(os.read(process.stderr.fileno(), 65536).decode(errors="replace"))


# the bar redraws at most every 0.1 s: a fast loop shows some step counts, not each one (5 to 99 steps done)
@pytest.mark.parametrize(
    "moment, shown, delay", [("compile", f" 0/{STEPS}", 0.3), ("loop", rf" ([5-9]|[1-9][0-9])/{STEPS}", 0.0)]
)
def test_ctrl_c_from_a_terminal_stops_the_run(tmp_path, moment, shown, delay):
    """SIGINT to the process group, as a terminal sends it: during the first step's compile, and between steps."""
    output = _previous(tmp_path)
    process = subprocess.Popen(
        [sys.executable, "-c", _TERMINAL, *_command(output)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=_environment(tmp_path),
        start_new_session=True,
    )
    seen: list[str] = []
    try:
        _read_until(process, shown, seen)
        time.sleep(delay)
        os.killpg(process.pid, signal.SIGINT)
        process.wait(timeout=120)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    seen.append(process.stderr.read().decode(errors="replace"))
    assert process.returncode == 130, "".join(seen)[-3000:]
    assert f"{STEPS}/{STEPS}" not in "".join(seen)
    assert _left_as_it_was(output)


# Ctrl-C as in a terminal: a shell that started the suite in the background leaves SIGINT ignored in its children
_TERMINAL = """
import signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)
from diffusers_tpu.commands import cli
sys.exit(cli.main(sys.argv[1:]))
"""
