"""What a user keeps (videos, images, audio, JSON reports, stage files) is written whole and verified, or not at all.

``write_atomically(path, write, verify)``: ``write(temp)`` fills a temporary file in the destination folder; it is
flushed to the disk (``fsync``), checked (non-empty; ``verify(temp)``: a readable container with the expected frame
count, ...) and only then renamed over ``path``. Any failure — a full disk, a file-size limit, an encoder that
failed without a word (``export_to_video`` ignores ffmpeg's errors), SIGINT or SIGTERM — removes the temporary
file and leaves the old ``path`` bit-identical; the error names the OS error.

``check_destination(path)``: before anything is loaded or compiled, the folder must be creatable and writable and
the parent path no file, so an hour of TPU time is never spent on a video that cannot be written.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import signal
import tempfile
import threading
import wave
from collections.abc import Callable

import imageio_ffmpeg
import PIL.Image


class DestinationError(ValueError):
    """An output path that cannot be written (found before anything runs)."""


class OutputError(OSError):
    """Writing an output failed; the previous file is unchanged and no partial file is left."""

    def __str__(self) -> str:
        return f"{self.strerror} (errno {self.errno})" if self.errno else str(self.strerror)


def _existing_ancestor(directory: str) -> str:
    while not os.path.lexists(directory):
        parent = os.path.dirname(directory)
        if parent == directory:
            break
        directory = parent
    return directory


def check_destination(path: str, needed_bytes: int = 0, what: str = "--output") -> None:
    """Raise ``DestinationError`` naming ``path`` and the fix unless a file can be written there: its folder exists
    or can be created, is writable (probed with a real file: read-only file systems bind root too), the path is no
    folder, and ``needed_bytes`` (a rough estimate, 0 if unknown) fit in the free space."""
    path = os.path.abspath(os.fspath(path))
    directory = os.path.dirname(path)
    if os.path.isdir(path):
        raise DestinationError(f"{what} {path} is a folder; give a file name, e.g. {os.path.join(path, 'video.mp4')}.")
    ancestor = _existing_ancestor(directory)
    if not os.path.isdir(ancestor):
        raise DestinationError(
            f"{what} {path}: {ancestor} is a file, not a folder, so the folder {directory} cannot "
            "be created there. Choose another output path, or move that file away."
        )
    try:
        if ancestor == directory:
            descriptor, probe = tempfile.mkstemp(prefix=".probe-", dir=directory)
            os.close(descriptor)
            os.remove(probe)
        else:  # the folder would be created: can it be?
            os.rmdir(tempfile.mkdtemp(prefix=".probe-", dir=ancestor))
    except OSError as error:
        raise DestinationError(
            f"{what} {path} cannot be written: {error.strerror or error} ({ancestor}). Choose a "
            "writable folder, or fix its permissions."
        ) from None
    free = shutil.disk_usage(ancestor).free
    if needed_bytes and free < needed_bytes:
        raise DestinationError(
            f"{what} {path}: about {needed_bytes / 1e6:.1f} MB are needed but {ancestor} has "
            f"{free / 1e6:.1f} MB free. Free some space or write elsewhere."
        )


@contextlib.contextmanager
def _sigterm_raises():
    """SIGTERM ends the process through Python's unwinding (SystemExit 143), so cleanup runs; only in the main thread,
    where signal handlers live, and only while writing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def terminate(signum, frame):
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _fsync(path: str, directory: bool = False) -> None:
    descriptor = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(descriptor)
    except OSError as error:
        if directory and error.errno in (errno.EINVAL, errno.ENOTSUP):  # some file systems cannot sync folders
            return
        raise
    finally:
        os.close(descriptor)


def _diagnose(directory: str, size: int) -> OSError | None:
    """The OS error writing ``size`` bytes in ``directory`` gives now, if any (why an encoder's file came out
    short: ffmpeg reports nothing through ``export_to_video``)."""
    try:
        with tempfile.TemporaryFile(dir=directory) as handle:
            handle.write(b"\0" * max(size, 1 << 20))
            handle.flush()
            os.fsync(handle.fileno())
    except OSError as error:
        return error
    return None


def write_atomically(
    path: str,
    write: Callable[[str], object],
    verify: Callable[[str], None] | None = None,
    expected_size: int = 0,
    before_replace: Callable[[str], None] | None = None,
) -> None:
    """``write(temp)`` writes a temporary file beside ``path`` (same extension: writers pick formats by it); after
    ``fsync`` and ``verify(temp)`` (raises on a bad file) it replaces ``path`` in one rename. On failure the old
    ``path`` is untouched, the temporary file removed, and ``OutputError`` names the OS error.
    ``before_replace(temp)``: runs just before the rename (a stage records the file first, so a file under its
    final name is always a recorded one, even if the process is killed in between)."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(directory, exist_ok=True)
        descriptor, temp = tempfile.mkstemp(suffix=os.path.splitext(path)[1], prefix=".partial-", dir=directory)
        os.close(descriptor)
    except OSError as error:
        raise OutputError(error.errno, f"cannot write {path}: {error.strerror or error}") from error
    try:
        with _sigterm_raises():
            try:
                write(temp)
                _fsync(temp)
                if os.path.getsize(temp) == 0:
                    raise OutputError(errno.EIO, f"the writer left {path} empty")
                if verify is not None:
                    verify(temp)
            except OutputError:
                raise
            except OSError as error:
                raise OutputError(error.errno, f"cannot write {path}: {error.strerror or error}") from error
            except Exception as error:  # the written file is not what it should be (unreadable, short)
                cause = _diagnose(directory, max(expected_size, os.path.getsize(temp) if os.path.exists(temp) else 0))
                reason = f"{cause.strerror or cause}" if cause is not None else f"{type(error).__name__}: {error}"
                raise OutputError(
                    cause.errno if cause is not None else errno.EIO, f"cannot write {path}: {reason}"
                ) from error
            if before_replace is not None:
                before_replace(temp)
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(temp, 0o666 & ~umask)  # mkstemp creates 0600; the file gets the user's usual mode
            os.replace(temp, path)
        _fsync(directory, directory=True)
    except BaseException as error:
        with contextlib.suppress(FileNotFoundError):
            os.remove(temp)
        if isinstance(error, OSError) and not isinstance(error, OutputError):
            raise OutputError(error.errno, f"cannot write {path}: {error.strerror or error}") from error
        raise


def write_text(path: str, text: str) -> None:
    """A text file (JSON reports, configs), verified by reading it back."""

    def write(temp):
        with open(temp, "w") as handle:
            handle.write(text)

    def verify(temp):
        with open(temp) as handle:
            if handle.read() != text:
                raise OSError(errno.EIO, "the file reads back differently")

    write_atomically(path, write, verify)


def write_json(path: str, value) -> None:
    write_text(path, json.dumps(value, indent=1))


def write_video(frames, path: str, fps: int) -> None:
    """Frames (PIL images or uint8 arrays) as a video with diffusers' ``export_to_video``, verified by counting the
    frames ffmpeg reads back."""

    def write(temp):  # ffmpeg starts through subprocess: JAX's fork warning is silenced for that (``startup``)
        # late: the command line checks outputs before torch loads; diffusers' writer as patched at call time
        from diffusers.utils import export_to_video  # noqa: PLC0415

        export_to_video(list(frames), temp, fps=fps)

    def verify(temp):
        count, _ = imageio_ffmpeg.count_frames_and_secs(temp)
        if count != len(frames):
            raise OSError(errno.EIO, f"the video holds {count} of {len(frames)} frames")

    write_atomically(path, write, verify, expected_size=1 << 20)


def write_image(image, path: str) -> None:
    """A PIL image, verified by decoding it back."""

    def verify(temp):
        with PIL.Image.open(temp) as written:
            written.load()
            if written.size != image.size:
                raise OSError(errno.EIO, f"the image reads back as {written.size}, not {image.size}")

    write_atomically(path, image.save, verify)


def write_wav(pcm, path: str, rate: int) -> None:
    """16-bit PCM ``[samples, channels]`` as a WAV file (stdlib ``wave``), verified by its frame count."""

    def write(temp):
        with wave.open(temp, "wb") as out:
            out.setnchannels(pcm.shape[1])
            out.setsampwidth(2)
            out.setframerate(int(rate))
            out.writeframes(pcm.tobytes())

    def verify(temp):
        with wave.open(temp, "rb") as written:
            if written.getnframes() != pcm.shape[0]:
                raise OSError(errno.EIO, f"the file holds {written.getnframes()} of {pcm.shape[0]} samples")

    write_atomically(path, write, verify)
