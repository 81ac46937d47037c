"""What a pipeline calls its denoiser with, found without running a model: the stock pipeline runs up to its first
denoiser call (text embeddings given as zeros, or a real prompt through its text encoders), the call is recorded and
the run stopped there. ``plan`` and ``tpu_check`` build the runtime's program from it."""

from __future__ import annotations

import contextlib
import inspect

import torch

from ..runtime.registry import family_of

# pipelines whose family gives ``Planning.call`` (image-to-video ones take images, not planned yet)
PLANNED_PIPELINES = (
    "WanPipeline",
    "CogVideoXPipeline",
    "HunyuanVideo15Pipeline",
    "CausalWanPipeline",
    "StableDiffusionXLPipeline",
)


# the prompt of planned calls that run the text encoders (quoted text: HunyuanVideo-1.5 runs its glyph encoder,
# ByT5, only for prompts with some)
PLAN_PROMPT = 'a cat holding a sign saying "hello" walks on the grass'


class _FirstCall(Exception):
    pass


def probe_denoiser_call(
    pipe,
    size: dict,
    text_tokens: int,
    dtype: torch.dtype,
    runtime=None,
    prompt: str | None = None,
    keywords: dict | None = None,
) -> tuple[tuple, dict, bool]:
    """The positional and keyword arguments of the pipeline's first denoiser call for a video of ``size``
    (``height``, ``width``, ``num_frames``, ``guidance_scale``), text embeddings given as zeros
    (``Planning.call``), the denoiser reporting ``dtype`` as it will once placed; and whether the call is
    guided (a second, unconditional pass per step). ``runtime``: its family's ``prepare`` wraps the probe as it
    would the compiled entry (HunyuanVideo-1.5's token order comes in as an argument). ``prompt``: the call takes
    this prompt (and an empty negative one) instead, its text encoders run. ``keywords``: the call's own keywords
    (prompt included) for any pipeline, instead of the family's ``Planning.call`` (``tpu_check``)."""
    family = family_of(pipe)
    if keywords is None and (family.planning.call is None or type(pipe).__name__ not in PLANNED_PIPELINES):
        raise ValueError(f"plan supports {', '.join(PLANNED_PIPELINES)} so far, not {type(pipe).__name__}.")
    module = getattr(pipe, family.denoisers[0])
    seen = {}

    def record(*args, **kwargs):
        seen["call"] = (args, kwargs)
        raise _FirstCall

    # the pipeline casts inputs to ``transformer.dtype``: make it report the dtype the placed module will have; and
    # it runs on the CPU (latents, scheduler tables) even when the weights are on ``meta``
    cls, pipe_cls = type(module), type(pipe)
    module.__class__ = type(cls.__name__, (cls,), {"dtype": property(lambda self: dtype)})
    pipe.__class__ = type(
        pipe_cls.__name__, (pipe_cls,), {"_execution_device": property(lambda self: torch.device("cpu"))}
    )
    if runtime is not None:
        runtime.overrides.set(module, "forward", record)  # where the compiled entry goes (undone with the runtime)
        if family.prepare is not None:
            family.prepare(pipe, runtime)
    else:
        vars(module)["forward"] = record
    bar = dict(getattr(pipe, "_progress_bar_config", {}))
    pipe.set_progress_bar_config(disable=True)
    try:
        with guidance(pipe, size["guidance_scale"]):
            guided = False
            try:
                call = (
                    keywords
                    if keywords is not None
                    else call_keywords(pipe, family.planning.call(pipe, size, text_tokens, dtype), text_tokens, prompt)
                )
                pipe(**call, output_type="latent")
            except _FirstCall:
                guided = guided_call(pipe)
    finally:
        if runtime is None:
            del vars(module)["forward"]
        module.__class__, pipe.__class__ = cls, pipe_cls
        pipe._progress_bar_config = bar
    if "call" not in seen:
        raise RuntimeError(f"{type(pipe).__name__} did not call its denoiser")
    return (*seen["call"], guided)


def call_keywords(pipe, keywords: dict, text_tokens: int | None, prompt: str | None) -> dict:
    """``Planning.call``'s keywords, or with ``prompt``: its text embeddings replaced by the prompt (the text
    encoders' inputs padded to ``text_tokens`` where the pipeline takes ``max_sequence_length``)."""
    if prompt is None:
        return keywords
    parameters = inspect.signature(pipe.__call__).parameters
    keywords = {k: v for k, v in keywords.items() if "prompt_embeds" not in k}
    keywords["prompt"] = prompt
    if "negative_prompt" in parameters:
        keywords["negative_prompt"] = ""
    if "max_sequence_length" in parameters and text_tokens:
        keywords["max_sequence_length"] = text_tokens
    return keywords


@contextlib.contextmanager
def guidance(pipe, scale: float):
    """Pipelines with a ``guider`` take the guidance scale there, not as a call argument: set it for a while."""
    guider = getattr(pipe, "guider", None)
    if guider is None or "guidance_scale" in inspect.signature(pipe.__call__).parameters:
        yield
        return
    pipe.guider = guider.new(guidance_scale=scale)
    try:
        yield
    finally:
        pipe.guider = guider


def guided_call(pipe) -> bool:
    """Whether the call under way runs a second, unguided denoiser pass per step."""
    guider = getattr(pipe, "guider", None)
    if guider is not None:
        return guider._enabled and guider.num_conditions > 1
    flag = getattr(pipe, "do_classifier_free_guidance", None)  # Wan's property; CogVideoX keeps only the scale
    scale = getattr(pipe, "_guidance_scale", None)  # None: guidance-distilled (Flux, Qwen-Image: true CFG aside)
    return bool(flag) if flag is not None else scale is not None and scale > 1.0


def concrete(value, batch: int):
    """Meta or host tensors as host zeros of the batch the runtime would run (the CFG pair as one batch)."""
    if not isinstance(value, torch.Tensor):
        return value
    shape = list(value.shape)
    if batch > 1 and shape:
        shape[0] *= batch
    return torch.zeros(shape, dtype=value.dtype)
