"""The registry of supported model families. Each ``diffusers_tpu/<family>.py`` registers one ``Family``."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

from .sharding import Rule


@dataclasses.dataclass(frozen=True)
class Family:
    """Everything the generic runtime needs to know about one model family.

    Attributes:
        name: short name, e.g. "wan".
        pipelines: the diffusers pipeline classes of the family that run on JAX (subclasses included).
        denoisers: component names of the denoising transformers (sharded by ``shard_rules`` and compiled).
        shard_rules: ``(regex, spec)`` rules for denoiser weights; unmatched weights are replicated.
        activation_rules: ``(regex, spec)`` sharding constraints on the first input of matching submodules.
        num_heads: the denoiser's attention head count (tensor parallelism must divide it).
        vae_methods: VAE methods compiled with jax.jit; "decoder.forward" compiles a submodule's method.
        cfg_negative: picks the negative embeddings out of ``encode_prompt``'s return value, enabling the
            classifier-free-guidance pair to run as one batch; None when the family batches CFG itself.
        cfg_condition_arg: the denoiser keyword that differs between the "cond" and "uncond" calls.
        cfg_batched_args: denoiser keywords whose leading dim is the batch.
        prepare: optional family-specific fix-up called after placement, ``prepare(pipe, runtime)``.
        check_call: ``check_call(pipe, arguments)`` validates a call's bound arguments before anything runs.
        decode_latents: ``decode_latents(pipe, latents, num_frames)``: stock ``__call__``'s tail after the loop
            (latents as ``output_type="latent"`` returns them -> decoded video), for staged runs.
        vae_install: ``vae_install(vae, runtime, state, place_input)`` installs the family's own compiled VAE
            (instead of compiling ``vae_methods``), e.g. Wan's temporal chunks.
        denoiser_forward: a jit-safe replacement for the denoiser's ``forward`` (same keywords), bound to the
            module and compiled in place of the stock one.
        tpu_dtypes: component name -> dtype on the TPU platform (e.g. a text encoder known to be safe in bf16),
            unless ``TPUConfig.component_dtypes`` or ``pipe.to(dtype)`` says otherwise.
        forward_flops: ``forward_flops(pipe, height, width, num_frames, text_tokens)``: analytic matmul FLOPs of
            one denoiser forward for one sample (benchmarks report MFU from it).
    """

    name: str
    pipelines: tuple[type, ...]
    denoisers: tuple[str, ...] = ("transformer",)
    shard_rules: tuple[Rule, ...] = ()
    activation_rules: tuple[Rule, ...] = ()
    num_heads: Callable[[object], int | None] = lambda pipe: None
    vae_methods: tuple[str, ...] = ("decode",)
    cfg_negative: Callable[[object], object] | None = None
    cfg_condition_arg: str = "encoder_hidden_states"
    cfg_batched_args: tuple[str, ...] = ()
    prepare: Callable[[object, object], None] | None = None
    check_call: Callable[[object, dict], None] | None = None
    decode_latents: Callable[[object, object, int], object] | None = None
    forward_flops: Callable[..., int] | None = None
    vae_install: Callable[..., None] | None = None
    denoiser_forward: Callable | None = None
    tpu_dtypes: Mapping[str, object] = dataclasses.field(default_factory=dict)


_families: list[Family] = []


def register(family: Family) -> Family:
    _families.append(family)  # patches.apply (or the first pipe.to) wraps the pipelines' __call__
    return family


def registered_pipelines() -> list[type]:
    return [cls for family in _families for cls in family.pipelines]


def supported_pipelines() -> list[str]:
    return sorted({cls.__name__ for family in _families for cls in family.pipelines})


def family_of(pipe) -> Family:
    for family in _families:
        if isinstance(pipe, family.pipelines):
            return family
    raise ValueError(
        f"{type(pipe).__name__} is not supported on JAX yet; supported pipelines: {supported_pipelines()}. "
        "Keep it on a torch device, or open an issue naming the pipeline."
    )
