"""The arguments a pipeline's ``__call__`` takes, out of the ones a command assembled (shared by ``generate``,
``bench`` and its stage timer; no import beyond the standard library)."""

from __future__ import annotations

import inspect


def call_arguments(pipe, call: dict) -> dict:
    """``call`` minus the arguments this pipeline's ``__call__`` does not take. Pipelines that guide through a
    diffusers guider (HunyuanVideo-1.5) take ``guidance_scale`` on their guider instead."""
    accepted = inspect.signature(type(pipe).__call__).parameters
    scale = call.get("guidance_scale")
    if "guidance_scale" not in accepted and scale is not None and getattr(pipe, "guider", None) is not None:
        pipe.guider = pipe.guider.new(guidance_scale=scale)
    return {name: value for name, value in call.items() if name in accepted}
