"""Staged runs: encode (prompt -> embeddings), denoise (-> latents), decode (-> uint8 video), resumable on disk.

Each stage writes its output as safetensors into a stage directory, plus ``generation_config.json`` recording
everything needed to continue (model, prompt, sizes, steps, seed, dtypes) and each output's sha256. Writes are
atomic (temp file + rename), so a run killed after ``denoise`` is finished by ``decode`` alone. A stage whose
output exists with the same settings is skipped (``force=True`` recomputes it and drops the stages after it);
a missing, corrupted or mismatched file raises ``StageError`` naming the stage to re-run — never a silent wrong
video. The stages run the stock pipeline (``encode_prompt``, ``__call__(output_type="latent")``, and the family's
copy of the few stock lines after the loop), so a staged run gives exactly the frames of a one-shot run.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import json
import os

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from ...interop import backend, user_tensors
from ..attach import pipeline_runtime
from ..call import postprocess
from ..registry import family_of
from . import outputs

CONFIG = "generation_config.json"
STAGES = ("encode", "denoise", "decode")
FILES = {"encode": "embeddings.safetensors", "denoise": "latents.safetensors", "decode": "video.safetensors"}
VERSION = 1


class StageError(ValueError):
    """A stage's input is missing, corrupted or from other settings."""


def _verify_tensors(path: str, tensors: dict) -> None:
    """The written stage file holds every tensor with its shape (its header reads back)."""
    with safe_open(path, framework="pt") as handle:
        shapes = {key: tuple(handle.get_slice(key).get_shape()) for key in handle.keys()}
    if shapes != {key: tuple(value.shape) for key, value in tensors.items()}:
        raise OSError(f"{path} reads back with other tensors than were written")


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


class StageDir:
    """A stage directory and its ``generation_config.json``."""

    def __init__(self, path):
        self.path = os.fspath(path)

    @property
    def config_path(self) -> str:
        return os.path.join(self.path, CONFIG)

    def config(self) -> dict:
        if not os.path.exists(self.config_path):
            return {"version": VERSION, "stages": {}}
        try:
            with open(self.config_path) as handle:
                config = json.load(handle)
        except (OSError, json.JSONDecodeError) as error:
            raise StageError(f"{self.config_path} is unreadable ({error}); start again in a new stage directory.")
        if config.get("version") != VERSION:
            raise StageError(f"{self.config_path} has version {config.get('version')!r}; expected {VERSION}.")
        return config

    def _write_config(self, config: dict) -> None:
        text = json.dumps(config, indent=2, sort_keys=True)
        outputs.write_text(self.config_path, text)

    def settings(self, stage: str) -> dict | None:
        entry = self.config()["stages"].get(stage)
        return entry["settings"] if entry else None

    def done(self, stage: str, settings: dict) -> bool:
        """True when ``stage``'s output exists, is intact and was made with ``settings``."""
        entry = self.config()["stages"].get(stage)
        if entry is None or not os.path.exists(os.path.join(self.path, FILES[stage])):
            return False  # never run, or its output was deleted: run it (again)
        if entry["settings"] != settings:
            raise StageError(
                f"stage {stage!r} in {self.path} was run with other settings ({_diff(entry['settings'], settings)}); "
                f"re-run it with force=True (CLI: --force) or use another stage directory."
            )
        self.load(stage)  # verifies the file
        return True

    def save(self, stage: str, tensors: dict, settings: dict) -> None:
        path = os.path.join(self.path, FILES[stage])
        tensors = {k: v.detach().cpu().contiguous() for k, v in tensors.items() if v is not None}

        def record(temp):  # before the file takes its name: a stage file on disk is always a recorded one
            config = self.config()
            later = STAGES[STAGES.index(stage) + 1 :]
            config["stages"] = {k: v for k, v in config["stages"].items() if k not in later}  # now stale
            config["stages"][stage] = {"file": FILES[stage], "sha256": _sha256(temp), "settings": settings}
            self._write_config(config)

        outputs.write_atomically(
            path,
            lambda temp: save_file(tensors, temp, metadata={"stage": stage}),
            verify=lambda temp: _verify_tensors(temp, tensors),
            before_replace=record,
        )

    def load(self, stage: str) -> dict:
        entry = self.config()["stages"].get(stage)
        path = os.path.join(self.path, FILES[stage])
        if entry is None or not os.path.exists(path):
            made = "was deleted" if entry is not None else "does not exist yet"
            raise StageError(
                f"{self.path} has no {stage!r} output: {FILES[stage]} {made}; run the {stage} stage "
                f"first (CLI: diffusers-tpu {stage} --stage-dir {self.path})."
            )
        if _sha256(path) != entry["sha256"]:
            raise StageError(
                f"{path} does not match the checksum recorded in {CONFIG} (modified or incomplete); re-run the "
                f"{stage} stage with force=True (CLI: --force)."
            )
        return load_file(path)


def _diff(old: dict, new: dict) -> str:
    keys = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
    return ", ".join(f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in keys)


def _staged_family(pipe):
    family = family_of(pipe)
    if family.decode_latents is None or family.name == "unet":  # the UNet family decodes for plan only, so far
        raise ValueError(
            f"Staged runs (--stage-dir) do not support {type(pipe).__name__} yet; generate it in one call "
            "(without --stage-dir). Staged runs support the Wan, CogVideoX and HunyuanVideo-1.5 text-to-video "
            "pipelines."
        )
    return family


def call_defaults(pipe) -> dict:
    return {
        name: p.default
        for name, p in inspect.signature(type(pipe).__call__).parameters.items()
        if p.default is not inspect.Parameter.empty
    }


@contextlib.contextmanager
def _on_pipeline_device(pipe):
    attached = pipeline_runtime.runtime_of(pipe)
    with attached.jax_context() if attached is not None else contextlib.nullcontext():
        yield attached


def _to_device(attached, tensor):
    if tensor is None or attached is None:
        return tensor
    return backend.wrap(backend.host_to_jax(tensor))


def encode(
    pipe,
    stage_dir,
    *,
    prompt,
    negative_prompt=None,
    guidance_scale=None,
    max_sequence_length=None,
    model: str | None = None,
    force: bool = False,
) -> dict:
    """Prompt -> ``{"prompt_embeds", "negative_prompt_embeds"}`` (host tensors), saved in ``stage_dir``."""
    defaults, stages, family = call_defaults(pipe), StageDir(stage_dir), _staged_family(pipe)
    default_scale = defaults.get("guidance_scale", getattr(getattr(pipe, "guider", None), "guidance_scale", None))
    settings = dict(
        model=model,
        pipeline=type(pipe).__name__,
        family=family.name,
        prompt=prompt,
        negative_prompt=negative_prompt,
        guidance_scale=default_scale if guidance_scale is None else guidance_scale,
        max_sequence_length=max_sequence_length or defaults.get("max_sequence_length"),
    )
    if not force and stages.done("encode", settings):
        return stages.load("encode")
    with _on_pipeline_device(pipe), torch.no_grad():  # as in stock __call__: grad mode changes CPU kernels
        if family.staging.encode is not None:
            tensors = family.staging.encode(
                pipe, prompt, negative_prompt, settings["guidance_scale"], settings["max_sequence_length"]
            )
        else:
            positive, negative = pipe.encode_prompt(
                prompt=prompt,
                negative_prompt=negative_prompt,
                do_classifier_free_guidance=settings["guidance_scale"] > 1.0,
                num_videos_per_prompt=1,
                max_sequence_length=settings["max_sequence_length"],
                device=pipe._execution_device,
            )
            tensors = {"prompt_embeds": positive, "negative_prompt_embeds": negative}
        tensors = user_tensors.to_host(tensors)
    stages.save("encode", tensors, settings)
    return stages.load("encode")


def denoise(
    pipe,
    stage_dir,
    *,
    height=None,
    width=None,
    num_frames=None,
    num_inference_steps=None,
    seed: int = 0,
    force: bool = False,
) -> torch.Tensor:
    """Embeddings -> latents (as ``output_type="latent"`` returns them), saved in ``stage_dir``."""
    stages = StageDir(stage_dir)
    embeddings = stages.load("encode")
    encoded = stages.settings("encode")
    defaults = call_defaults(pipe)
    pick = lambda value, name: defaults.get(name) if value is None else value  # noqa: E731
    settings = dict(
        height=pick(height, "height"),
        width=pick(width, "width"),
        num_frames=pick(num_frames, "num_frames"),
        num_inference_steps=pick(num_inference_steps, "num_inference_steps"),
        seed=seed,
        encode_sha256=stages.config()["stages"]["encode"]["sha256"],
    )
    family = _staged_family(pipe)
    if family.check_call is not None:  # a staged run always decodes: refuse bad frame counts up front
        family.check_call(pipe, {"num_frames": settings["num_frames"], "output_type": "np"})
    if not force and stages.done("denoise", settings):
        return stages.load("denoise")["latents"]
    attached = pipeline_runtime.runtime_of(pipe)
    call = {k: v for k, v in settings.items() if k not in ("seed", "encode_sha256") and v is not None}
    if family.staging.inputs is not None:
        text = family.staging.inputs(pipe, embeddings, encoded["guidance_scale"])
    else:
        text = dict(
            prompt_embeds=embeddings["prompt_embeds"],
            negative_prompt_embeds=embeddings.get("negative_prompt_embeds"),
            guidance_scale=encoded["guidance_scale"],
        )
    text = {k: _to_device(attached, v) if isinstance(v, torch.Tensor) else v for k, v in text.items()}
    latents = pipe(**text, generator=torch.Generator().manual_seed(seed), output_type="latent", **call).frames
    stages.save("denoise", {"latents": latents}, settings)
    return stages.load("denoise")["latents"]


def decode(pipe, stage_dir, *, force: bool = False) -> np.ndarray:
    """Latents -> uint8 frames ``[batch, frames, height, width, 3]`` (stock "pil" rounding), saved in ``stage_dir``."""
    stages = StageDir(stage_dir)
    latents = stages.load("denoise")["latents"]
    denoised = stages.settings("denoise")
    settings = {"denoise_sha256": stages.config()["stages"]["denoise"]["sha256"]}
    if not force and stages.done("decode", settings):
        return stages.load("decode")["frames"].numpy()
    family = _staged_family(pipe)
    num_frames = denoised["num_frames"] or getattr(pipe.transformer.config, "sample_frames", None)
    if family.check_call is not None:
        family.check_call(pipe, {"num_frames": num_frames, "output_type": "np"})
    with _on_pipeline_device(pipe) as attached, torch.no_grad():
        video = family.decode_latents(pipe, _to_device(attached, latents), num_frames)
        if attached is not None:
            frames = postprocess.frames_uint8(video)
        else:
            frames = np.round(pipe.video_processor.postprocess_video(video, output_type="np") * 255).astype(np.uint8)
    stages.save("decode", {"frames": torch.from_numpy(np.array(frames))}, settings)
    return stages.load("decode")["frames"].numpy()


def generate(
    pipe,
    stage_dir,
    *,
    prompt,
    negative_prompt=None,
    guidance_scale=None,
    max_sequence_length=None,
    height=None,
    width=None,
    num_frames=None,
    num_inference_steps=None,
    seed: int = 0,
    model=None,
    stop_after: str | None = None,
    force: bool = False,
):
    """All stages in order (each skipped when its output already exists); returns the frames, or None when
    ``stop_after`` ends the run early."""
    if stop_after is not None and stop_after not in STAGES:
        raise ValueError(f"stop_after={stop_after!r} must be one of {list(STAGES)}.")
    encode(
        pipe,
        stage_dir,
        prompt=prompt,
        negative_prompt=negative_prompt,
        guidance_scale=guidance_scale,
        max_sequence_length=max_sequence_length,
        model=model,
        force=force,
    )
    if stop_after == "encode":
        return None
    denoise(
        pipe,
        stage_dir,
        height=height,
        width=width,
        num_frames=num_frames,
        num_inference_steps=num_inference_steps,
        seed=seed,
        force=force,
    )
    if stop_after == "denoise":
        return None
    return decode(pipe, stage_dir, force=force)
