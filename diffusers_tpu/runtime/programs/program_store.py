"""Programs built ahead: executables written to a folder by one process (``diffusers-tpu compile``, or any run with
``TPUConfig(programs=DIR)``) and loaded by another instead of compiled — on any machine for a TPU slice (the TPU
compiler runs without a TPU), or for this machine's own devices.

Each program is stored under a key made of everything that makes it: its lowered module (``Lowered.as_text()``: the
trace bakes in configs, dtypes, LoRA scales, shardings and the mesh; source locations left out), its build options
(``runtime.program_builds``), the jax/jaxlib/libtpu and diffusers_tpu versions, the platform, the devices in the
mesh's order, and ``XLA_FLAGS``/``LIBTPU_INIT_ARGS``. A program runs only under the key it was built for: anything
else compiles, with one line naming what differed. Files: ``<module>-<environment>.program`` (the serialized
executable) beside ``.json`` (the key's fields and the payload's SHA-256, checked before loading). Writes are atomic
(a temporary file renamed); a truncated or corrupt file is set aside (``.bad``) and the program compiled; a folder
that cannot be written is used read-only, with one line saying so.

A serialized executable is code for the accelerator (``jax.experimental.serialize_executable`` unpickles it): load
only folders you built, as you would a compilation cache. Loading on a real TPU is untested here (no TPU).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import logging
import os
import threading

import jax
from jax.experimental import serialize_executable

from ...interop import jax_private

logger = logging.getLogger(__name__)

_told: set = set()  # one line per reason and folder
_lock = threading.Lock()


def _say_once(message: str) -> None:
    with _lock:
        if message in _told:
            return
        _told.add(message)
    logger.warning(message)


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def devices_of(lowered) -> list:
    """The devices a lowered program runs on, in the mesh's order (its first sharded argument's assignment)."""
    return jax_private.lowered_devices(lowered) or [jax.devices()[0]]


def environment(devices) -> dict:
    """What besides the module makes a program: versions, platform, devices in order, compiler flags."""
    return {
        "jax": jax.__version__,
        "jaxlib": _version("jaxlib"),
        "libtpu": _version("libtpu") if devices and devices[0].platform == "tpu" else None,
        "diffusers_tpu": _version("diffusers-tpu"),
        "platform": devices[0].platform,
        "devices": [
            [d.device_kind, d.id, list(getattr(d, "coords", ()) or ()), getattr(d, "core_on_chip", None)]
            for d in devices
        ],
        "XLA_FLAGS": os.environ.get("XLA_FLAGS", ""),
        "LIBTPU_INIT_ARGS": os.environ.get("LIBTPU_INIT_ARGS", ""),
    }


def _digest(value) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


class ProgramStore:
    """A folder of built programs (module docstring)."""

    def __init__(self, directory: str):
        self.directory = os.fspath(directory)  # (a file there is refused by TPUConfig, before anything moves)
        self.writable = True
        try:
            os.makedirs(self.directory, exist_ok=True)
        except OSError as error:
            self.writable = False
            _say_once(f"programs folder {self.directory} cannot be created ({error}): programs compile, none saved")
        if self.writable and not os.access(self.directory, os.W_OK):
            self.writable = False
            _say_once(f"programs folder {self.directory} is read-only here: programs load from it, none are saved")

    def _paths(self, module: str, env: str) -> tuple[str, str]:
        stem = os.path.join(self.directory, f"{module}-{env}")
        return stem + ".program", stem + ".json"

    def key(self, lowered, options: dict | None) -> tuple[str, dict, str]:
        """``(module key, environment, environment key)`` of a lowered program and its build options."""
        module = _digest(lowered.as_text() + "\n" + json.dumps(options or {}, sort_keys=True))
        env = environment(devices_of(lowered))
        return module, env, _digest(env)

    def load(self, lowered, options: dict | None = None):
        """The stored executable built for exactly this program here, or None (one line says why not)."""
        if not os.path.isdir(self.directory):
            return None
        module, env, env_key = self.key(lowered, options)
        payload_path, meta_path = self._paths(module, env_key)
        if not os.path.exists(meta_path):
            self._explain_miss(module, env)
            return None
        try:
            with open(meta_path) as handle:
                meta = json.load(handle)
            with open(payload_path, "rb") as handle:
                payload = handle.read()
            if hashlib.sha256(payload).hexdigest() != meta["sha256"] or meta["environment"] != env:
                raise ValueError("its contents do not match its key (truncated or changed)")
            return serialize_executable.deserialize_and_load(
                payload, lowered.in_tree, lowered.out_tree, execution_devices=devices_of(lowered)
            )
        except Exception as error:  # noqa: BLE001 (a program that cannot load is compiled instead)
            self._set_aside(payload_path, meta_path, error)
            return None

    def _explain_miss(self, module: str, env: dict) -> None:
        """One line when this program was stored for another environment: which fields differ."""
        prefix = f"{module}-"
        for name in sorted(os.listdir(self.directory)):
            if not (name.startswith(prefix) and name.endswith(".json")):
                continue
            try:
                with open(os.path.join(self.directory, name)) as handle:
                    stored = json.load(handle)["environment"]
            except (OSError, ValueError, KeyError):
                continue
            differ = [
                f"{field} {stored.get(field)!r} there, {env.get(field)!r} here"
                for field in env
                if stored.get(field) != env.get(field)
            ]
            _say_once(
                f"programs folder {self.directory}: a program was built for another setup ({'; '.join(differ)}): "
                "compiling it here"
            )
            return

    def _set_aside(self, payload_path: str, meta_path: str, error: Exception) -> None:
        for path in (payload_path, meta_path):
            try:
                os.replace(path, path + ".bad")
            except OSError:
                pass
        _say_once(
            f"programs folder {self.directory}: {os.path.basename(payload_path)} could not be loaded ({error}); "
            "set aside as .bad, compiling it"
        )

    def save(self, lowered, options: dict | None, compiled) -> bool:
        """Write ``compiled`` under its key, atomically; False (one line) when it cannot be written."""
        if not self.writable:
            return False
        module, env, env_key = self.key(lowered, options)
        payload_path, meta_path = self._paths(module, env_key)
        try:
            payload, _, _ = serialize_executable.serialize(compiled)
            meta = {"environment": env, "options": options or {}, "sha256": hashlib.sha256(payload).hexdigest()}
            _write_atomically(payload_path, payload)
            _write_atomically(meta_path, json.dumps(meta, indent=1).encode())  # last: a key only for a whole payload
            return True
        except Exception as error:  # noqa: BLE001 (a full disk or an unserializable program: the run goes on)
            _say_once(f"programs folder {self.directory}: could not save a program ({error}); the run goes on")
            return False


def _write_atomically(path: str, data: bytes) -> None:
    temporary = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    try:
        with open(temporary, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)
