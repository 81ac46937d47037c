"""The family contract and registry: each ``families/<family>.py`` registers one ``Family``; the generic path
registers a fallback that infers a family from any transformer pipeline (``register_fallback``)."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping

import diffusers
import torch

from ..interop.sharding import Rule

DENOISERS = ("transformer", "transformer_2", "transformer_3")  # component names a denoiser may have


def attention_heads(pipe) -> int | None:
    """``config.num_attention_heads`` of the pipeline's transformer: ``Family.num_heads`` unless a family says."""
    return getattr(getattr(getattr(pipe, "transformer", None), "config", None), "num_attention_heads", None)


@dataclasses.dataclass(frozen=True)
class CFGBatching:
    """How a family's classifier-free-guidance pair runs as one batch of two (``runtime.cfg.CFGPairing``)."""

    # picks the negative embeddings out of ``encode_prompt``'s return value
    negative: Callable[[object], object]
    # the denoiser keyword (or keywords, in ``negative``'s order) that differs between the "cond" and "uncond" calls
    condition_args: str | tuple[str, ...] = "encoder_hidden_states"
    # denoiser keywords whose leading dimension is the batch
    batched_args: tuple[str, ...] = ()
    # those of them whose leading dimension holds a whole number of rows per sample (Wan's first-last-frame image
    # embeddings: two images a sample, which the model regroups)
    grouped_args: tuple[str, ...] = ()
    # which ``encode_prompt`` call of a pipeline call returns the negative embeddings (0: the first, which returns
    # both; 1: a second call made for the negative prompt only)
    negative_call: int = 0
    # the cond and uncond text lengths may differ: batch them padded to the longer one with masked tokens (only where
    # the model masks padded text keys exactly); the condition keywords after the first are then masks, which the
    # pipeline may leave None (all ones)
    pad_text: bool = False

    @property
    def paired_arguments(self) -> set[str]:
        """Every denoiser keyword the pair's batch stacks."""
        condition = (self.condition_args,) if isinstance(self.condition_args, str) else self.condition_args
        return set(self.batched_args) | set(condition)


@dataclasses.dataclass(frozen=True)
class Planning:
    """What the planner and the commands read of a family (``plan``, ``cost``, ``bench``'s MFU); nothing a pipeline
    call reads. Each field None where the family does not say."""

    # ``forward_flops(pipe, height, width, num_frames, text_tokens)``: analytic matmul FLOPs of one denoiser forward
    # for one sample (benchmarks report MFU from it).
    forward_flops: Callable[..., int] | None = None
    # ``call(pipe, size, text_tokens, dtype)`` -> the pipeline call's keywords for a video of ``size`` (``height``,
    # ``width``, ``num_frames``, ``guidance_scale``) with zero text embeddings standing in for the text encoders:
    # ``plan`` runs the pipeline up to its first denoiser call with them (``zero_text_call`` makes the common one).
    call: Callable[..., dict] | None = None
    # ``passes(kwargs)`` -> the keywords of the denoiser's other programs in a call, given its first call's (causal
    # Wan's cache-writing pass); ``plan`` analyses each.
    passes: Callable[[dict], list[dict]] | None = None


@dataclasses.dataclass(frozen=True)
class Staging:
    """What a staged run (encode -> denoise -> decode on disk, ``runtime/files/stages.py``) reads of a family beyond
    its ``decode_latents``; None: stock's ``encode_prompt`` embeddings and keywords."""

    # ``encode(pipe, prompt, negative_prompt, guidance_scale, max_sequence_length)`` -> the named text tensors a staged
    # run saves (default: ``encode_prompt``'s positive/negative embeddings).
    encode: Callable[..., dict] | None = None
    # ``inputs(pipe, tensors, guidance_scale)`` -> the pipeline call's keywords for saved text tensors (default:
    # ``prompt_embeds``, ``negative_prompt_embeds``, ``guidance_scale``).
    inputs: Callable[..., dict] | None = None


@dataclasses.dataclass(frozen=True)
class Family:
    """What the runtime needs to know to run one model family, each field's meaning beside it; what the planner and
    staged runs read are records of their own (``planning``, ``staging``)."""

    # short name, e.g. "wan".
    name: str
    # the diffusers pipeline classes of the family that run on JAX (subclasses included).
    pipelines: tuple[type, ...]
    # component names of the denoising transformers (sharded by ``shard_rules`` and compiled).
    denoisers: tuple[str, ...] = ("transformer",)
    # ``(regex, spec)`` rules for denoiser weights; unmatched weights are replicated.
    shard_rules: tuple[Rule, ...] = ()
    # ``(regex, spec)`` sharding constraints on the first input of matching submodules.
    activation_rules: tuple[Rule, ...] = ()
    # the denoiser's attention head count (tensor parallelism must divide it); by default the transformer's
    # ``config.num_attention_heads``.
    num_heads: Callable[[object], int | None] = attention_heads
    # VAE methods compiled with jax.jit; "decoder.forward" compiles a submodule's method (default: the decoder's and the
    # encoder's; the code around them, tiling and frame loops, runs as stock).
    vae_methods: tuple[str, ...] = ("decoder.forward", "encoder.forward")
    # how the classifier-free-guidance pair runs as one batch (``CFGBatching``); None when the family batches it itself
    # or cannot.
    cfg: CFGBatching | None = None
    # optional family-specific fix-up called after placement, ``prepare(pipe, runtime)``.
    prepare: Callable[[object, object], None] | None = None
    # ``check_call(pipe, arguments)`` validates a call's bound arguments before anything runs.
    check_call: Callable[[object, dict], None] | None = None
    # ``decode_latents(pipe, latents, num_frames)``: stock ``__call__``'s tail after the loop (latents as
    # ``output_type="latent"`` returns them -> decoded video): staged runs decode with it, ``plan`` analyses it.
    decode_latents: Callable[[object, object, int], object] | None = None
    # ``vae_install(vae, runtime, state, place_input)`` installs the family's own compiled VAE (instead of compiling
    # ``vae_methods``), e.g. Wan's temporal chunks.
    vae_install: Callable[..., None] | None = None
    # the names of the programs ``vae_install`` compiles (what ``runtime.decision`` lists).
    vae_programs: tuple[str, ...] = ()
    # a jit-safe replacement for the denoiser's ``forward`` (same keywords), bound to the module and compiled in place
    # of the stock one.
    denoiser_forward: Callable | None = None
    # component name -> dtype on the TPU platform (e.g. a text encoder known to be safe in bf16), unless
    # ``TPUConfig.component_dtypes`` or ``pipe.to(dtype)`` says otherwise.
    tpu_dtypes: Mapping[str, object] = dataclasses.field(default_factory=dict)
    # ``rules_for(module, mesh_shape)``: sharding rules inferred from a denoiser's structure, after ``shard_rules`` (the
    # generic path's whole table).
    rules_for: Callable[..., tuple] | None = None
    # what ``plan``, ``cost`` and ``bench`` read of the family (``Planning``).
    planning: Planning = Planning()  # frozen: one shared empty record is safe
    # what a staged run reads of the family (``Staging``).
    staging: Staging = Staging()

    def rules(self, module, mesh_shape) -> tuple:
        """Sharding rules of a denoiser: the family's table, then rules inferred from the module (``rules_for``)."""
        inferred = self.rules_for(module, mesh_shape) if self.rules_for is not None else ()
        return tuple(self.shard_rules) + tuple(inferred)


_families: list[Family] = []
_fallbacks: list[Callable[[object], Family | None]] = []
_loaders: list[Callable[[], None]] = []  # import the family modules on first need (they import diffusers' models)


def register_loader(load: Callable[[], None]) -> None:
    """``load()`` registers families (by importing their modules); it runs the first time a family is looked up."""
    if load not in _loaders:
        _loaders.append(load)


def _load() -> list[Family]:
    while _loaders:
        load = _loaders.pop(0)
        try:
            load()
        except BaseException:
            _loaders.insert(0, load)  # tried again next time (the error, e.g. a broken install, is the user's to see)
            raise
    return _families


def vae_methods(vae) -> tuple[str, ...]:
    """The VAE's tensor-in, tensor-out parts: its decoder and encoder modules (the code around them, tiling and
    frame loops, runs as stock)."""
    if vae is None:
        return ()
    return tuple(f"{n}.forward" for n in ("decoder", "encoder") if isinstance(getattr(vae, n, None), torch.nn.Module))


def zero_text_call(width_of: Callable[[object], int]) -> Callable[..., dict]:
    """``Planning.call`` of a text-to-video pipeline taking ``prompt_embeds`` / ``negative_prompt_embeds`` (zeros
    ``[1, text_tokens, width_of(pipe)]``), ``num_frames`` and ``guidance_scale``."""

    def call(pipe, size: dict, tokens: int, dtype) -> dict:
        embeddings = torch.zeros(1, tokens, width_of(pipe), dtype=dtype)
        return dict(size, prompt_embeds=embeddings, negative_prompt_embeds=embeddings, num_inference_steps=2)

    return call


def register(family: Family) -> Family:
    _families.append(family)  # the first pipe.to('tpu') of a pipeline wraps its class's __call__
    return family


def models_around_a_vae(cls) -> bool:
    """A pipeline class without a transformer or UNet denoiser whose components are a VAE and other diffusers models
    (LTX's and LTX-2's latent upsamplers): each model's forward is compiled as it is, the VAE's methods as a VAE's."""
    parameters = inspect.signature(cls.__init__).parameters
    if "unet" in parameters or any(name.startswith("transformer") for name in parameters):
        return False  # a denoiser: the UNet or the transformer path
    models = [
        n
        for n, p in parameters.items()
        if isinstance(p.annotation, type) and issubclass(p.annotation, diffusers.ModelMixin)
    ]
    return "vae" in models and len(models) > 1


def register_fallback(family_for: Callable[[object], Family | None]) -> None:
    """``family_for(pipe)``: a family for a pipeline no registered family claims, or None (the generic path)."""
    if family_for not in _fallbacks:
        _fallbacks.append(family_for)


def registered_pipelines() -> list[type]:
    return [cls for family in _load() for cls in family.pipelines]


_catalogue: dict[str, str] | None = None
# A modular pipeline whose classic pipeline's name is not its own name without "Modular".
_CLASSIC = {
    "Wan22ModularPipeline": "WanPipeline",
    "WanImage2VideoModularPipeline": "WanImageToVideoPipeline",
    "Wan22Image2VideoModularPipeline": "WanImageToVideoPipeline",
    "Wan22VaceModularPipeline": "WanVACEPipeline",
    "WanAnimate2ModularPipeline": "WanAnimatePipeline",
    "LTX25ModularPipeline": "LTX2Pipeline",
}


def classic_pipeline(modular_name: str) -> str | None:
    """The classic diffusers pipeline class (its name) that runs what a modular pipeline class runs, if there is one."""
    name = _CLASSIC.get(modular_name, modular_name.replace("ModularPipeline", "Pipeline"))
    return name if name != modular_name and hasattr(diffusers, name) else None


def pipeline_paths() -> dict[str, str]:
    """Every diffusers pipeline class -> the path it takes on JAX: ``"family <name>"`` (a family file), ``"generic"``
    (a transformer denoiser), ``"unet"`` (a UNet denoiser), or why none (``"unsupported: ..."``). Whether a class was
    compared with stock is ``runtime.support``'s table. Imports every pipeline class once (seconds)."""
    global _catalogue
    if _catalogue is None:
        found = {}
        _load()
        for name in sorted(n for n in dir(diffusers) if n.endswith("Pipeline") and n != "DiffusionPipeline"):
            try:
                cls = getattr(diffusers, name)
                parameters = inspect.signature(cls.__init__).parameters
            except Exception as error:  # an optional dependency missing
                found[name] = f"unsupported: cannot import ({type(error).__name__})"
                continue
            family = next((f for f in _load() if issubclass(cls, f.pipelines)), None)
            if name.endswith("ModularPipeline"):
                classic = classic_pipeline(name)
                found[name] = (
                    f"unsupported: a modular pipeline; use {classic}"
                    if classic
                    else "unsupported: a modular pipeline; use its family's classic pipeline class"
                )
            elif family is not None:
                found[name] = f"family {family.name}"
            elif any(p.startswith("transformer") for p in parameters):
                found[name] = "generic"
            elif "unet" in parameters:
                found[name] = "unet"
            elif models_around_a_vae(cls):
                found[name] = "generic"
            else:
                found[name] = "unsupported: no transformer or UNet denoiser"
        _catalogue = found
    extra = {cls.__name__: f"family {f.name}" for f in _load() for cls in f.pipelines}  # diffusers_tpu's classes
    return {**_catalogue, **extra}


def family_of(pipe) -> Family:
    for family in _load():
        if isinstance(pipe, family.pipelines):
            return family
    for family_for in _fallbacks:
        family = family_for(pipe)
        if family is not None:
            return family
    raise ValueError(
        f"{type(pipe).__name__} cannot run on JAX: it has no diffusers transformer or UNet denoiser (components "
        f"{sorted(pipe.components)}). Families: {sorted({f.name for f in _load()})}; any pipeline with a "
        "diffusers `transformer` takes the generic path, any with a diffusers `unet` the UNet path "
        "(diffusers_tpu.supported_pipelines() lists each class and whether it was compared with stock). Keep it on "
        "a torch device, or open an issue."
    )
