"""diffusers-tpu generate: writes a readable mp4 with the requested frame count; bad input exits cleanly."""

import os
import subprocess
import sys

import imageio.v3 as iio
import numpy as np
import pytest

from diffusers_tpu.commands import cli, parser


def run_cli(*args, env=None):
    return subprocess.run(
        [sys.executable, "-m", "diffusers_tpu.commands.cli", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **(env or {})},
    )


@pytest.mark.slow
def test_generate_writes_the_requested_frames(tmp_path):
    import PIL.Image

    out, strip = tmp_path / "videos" / "cat.mp4", tmp_path / "strip.png"
    result = run_cli(
        "generate",
        "--frames",
        "19",
        "--height",
        "32",
        "--width",
        "48",
        "--steps",
        "2",
        "--platform",
        "cpu",
        "--output",
        str(out),
        "--strip",
        str(strip),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    frames = iio.imread(out)
    assert frames.shape == (19, 32, 48, 3) and frames.dtype == np.uint8
    # the strip: the same frames side by side (exact frames; the mp4 is lossy — 4:2:0 chroma — so compared to the
    # video only on average: measured 4.7 levels here; the README strip test checks the frames themselves)
    side_by_side = np.asarray(PIL.Image.open(strip))
    assert side_by_side.shape == (32, 19 * 48, 3)
    assert np.abs(side_by_side.astype(float) - np.concatenate(list(frames), axis=1)).mean() < 8
    assert "compile" in result.stdout and "run" in result.stdout and "wrote 19 frames" in result.stdout
    assert [p.name for p in out.parent.iterdir()] == ["cat.mp4"]  # no temp file left behind
    # the demo transformer's temporal patch spans 5 latent frames: 13 frames (7 latent) are refused before loading
    result = run_cli("generate", "--frames", "13", "--steps", "2", "--platform", "cpu", "--output", str(out))
    assert result.returncode == 2 and "use 9 or 19" in result.stderr and "loaded" not in result.stdout
    assert [p.name for p in out.parent.iterdir()] == ["cat.mp4"]
    # a strip that is not an image is refused before anything loads
    result = run_cli("generate", "--platform", "cpu", "--output", str(out), "--strip", str(tmp_path / "strip.mp4"))
    assert result.returncode == 2 and "end it in .png" in result.stderr and "loaded" not in result.stdout


@pytest.mark.slow
def test_mesh_and_platform_errors_exit_2_without_writing(tmp_path):
    out = tmp_path / "v.mp4"
    result = run_cli("generate", "--mesh", "2,1,1", "--output", str(out))
    assert result.returncode == 2 and "spans 2 devices but there are 1" in result.stderr
    result = run_cli("generate", "--platform", "tpu", "--output", str(out))
    assert result.returncode == 2 and "no TPU" in result.stderr
    assert not out.exists()


@pytest.mark.slow
def test_image_pipelines_write_images(tmp_path):
    """An image pipeline from the CLI: a PNG of the requested size, written atomically; a video path is refused
    before any weight moves."""
    import PIL.Image

    out = tmp_path / "flux.png"
    result = run_cli(
        "generate",
        "--model",
        "tiny:flux",
        "--height",
        "32",
        "--width",
        "48",
        "--steps",
        "2",
        "--platform",
        "cpu",
        "--output",
        str(out),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    image = PIL.Image.open(out)
    assert image.size == (48, 32) and np.asarray(image).std() > 0
    assert [p.name for p in tmp_path.iterdir()] == ["flux.png"]
    result = run_cli("generate", "--model", "tiny:flux", "--platform", "cpu", "--output", str(tmp_path / "x.mp4"))
    assert result.returncode == 2 and "makes images" in result.stderr and "loaded" not in result.stdout
    result = run_cli(
        "generate",
        "--model",
        "tiny:flux",
        "--platform",
        "cpu",
        "--output",
        str(out),
        "--strip",
        str(tmp_path / "s.png"),
    )
    assert result.returncode == 2 and "--strip" in result.stderr and "loaded" not in result.stdout


def test_mesh_argument_parsing():
    assert parser.mesh_arg("2,1,4") == {"dp": 2, "sp": 1, "tp": 4}
    for bad in ("2,1", "a,b,c", "0,1,1"):
        try:
            parser.mesh_arg(bad)
        except Exception as error:  # argparse.ArgumentTypeError
            assert "dp,sp,tp" in str(error)
        else:
            raise AssertionError(f"--mesh {bad} accepted")


def test_a_failed_write_keeps_the_previous_video(tmp_path, monkeypatch):
    path = tmp_path / "keep.mp4"
    path.write_bytes(b"previous video")

    def broken(frames, output, fps):
        open(output, "wb").write(b"half a video")
        raise OSError("disk full")

    import diffusers.utils

    monkeypatch.setattr(diffusers.utils, "export_to_video", broken)
    from diffusers_tpu.runtime.files import outputs

    with pytest.raises(outputs.OutputError, match="disk full"):
        outputs.write_video([np.zeros((4, 4, 3))], str(path), fps=8)
    assert path.read_bytes() == b"previous video"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.mp4"]


def test_audio_is_written_as_16_bit_wav_atomically(tmp_path):
    """LTX-2's soundtrack: [channels, samples] floats -> a WAV beside the video; a failed write keeps the old file."""
    import wave

    audio = np.stack([np.linspace(-1.5, 1.5, 50), np.sin(np.arange(50.0))]).astype(np.float32)
    path = tmp_path / "clip.wav"
    cli.write_audio(audio, str(path), 16000)
    with wave.open(str(path)) as read:
        assert (read.getnchannels(), read.getframerate(), read.getnframes()) == (2, 16000, 50)
        pcm = np.frombuffer(read.readframes(50), dtype="<i2").reshape(50, 2).T
    assert np.abs(pcm / 32767 - np.clip(audio, -1, 1)).max() <= 1 / 32767
    with pytest.raises(ValueError):
        cli.write_audio(np.zeros((0, 4)), str(path), 16000)  # no channels: wave refuses
    assert path.stat().st_size > 0 and [p.name for p in tmp_path.iterdir()] == ["clip.wav"]


@pytest.mark.slow
def test_readme_frame_strip_is_what_the_documented_command_writes(tmp_path):
    """README shows the default prompt's frames (diffusers_tpu/demo/strip.png, made by the command README names):
    the shipped model still draws them (same rule as every pil comparison: one level, <= 0.1% of subpixels). The
    command, README's first one plus --strip, run as the installed console script prints nothing on stderr but
    progress bars."""
    import PIL.Image

    from tests.commands.test_cli_start import _warnings_in

    repository = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    shown = os.path.join(repository, "diffusers_tpu", "demo", "strip.png")
    command = "diffusers-tpu generate --output video.mp4 --strip diffusers_tpu/demo/strip.png"
    assert command in open(os.path.join(os.path.dirname(shown), "..", "..", "README.md")).read()
    script = os.path.join(os.path.dirname(sys.executable), "diffusers-tpu")
    result = subprocess.run(
        [script, "generate", "--output", "video.mp4", "--strip", "strip.png"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert _warnings_in(result.stderr) == [] and "start to finish" in result.stdout
    made, expected = (np.asarray(PIL.Image.open(p)).astype(int) for p in (tmp_path / "strip.png", shown))
    assert made.shape == expected.shape == (64, 9 * 64, 3)
    difference = np.abs(made - expected)
    assert difference.max() <= 1 and (difference > 0).mean() <= 1e-3
