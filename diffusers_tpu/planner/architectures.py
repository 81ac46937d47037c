"""Real-size pipelines with random weights, built from published configs with no download (for benchmarks).

Parameters are created empty (accelerate's ``init_empty_weights``) and then filled in place — normal(0, 0.02)
for matrices, ones for norm scales, zeros for biases — so no time goes into torch's default initializers, while
buffers (RoPE tables and the like) keep their real computed values. The videos are noise; the shapes, FLOPs and
memory are the real model's. Host memory: the text encoders are large (UMT5-XXL's encoder is 5.7B parameters, 13.4 GB
in bfloat16 with its feed-forward outputs in float32 as transformers keeps them), so Wan2.1-1.3B needs roughly 24 GB
of host RAM or more; TPU and GPU hosts have that, small VMs do not. Tied weights are tied as ``from_pretrained``
ties them.
"""

from __future__ import annotations

import json
import os

import diffusers
import torch
import transformers
from accelerate import init_empty_weights
from transformers import (
    ByT5Tokenizer,
    CLIPTextConfig,
    CLIPTextModel,
    CLIPTextModelWithProjection,
    Qwen2_5_VLTextConfig,
    Qwen2_5_VLTextModel,
    T5Config,
    T5EncoderModel,
    UMT5Config,
    UMT5EncoderModel,
)

from ..families import cogvideox, hunyuan_video15, wan
from ..families.causal_wan import CAUSAL_DEFAULTS, CausalWanTransformer3DModel
from ..families.causal_wan_pipeline import CausalWanPipeline
from ..interop.sharding import keep_in_fp32
from ..runtime.weights import loading
from . import standins

# UMT5-XXL (Wan's text encoder) and T5-v1.1-XXL (CogVideoX's), encoder halves.
_T5_XXL = dict(
    d_model=4096,
    d_kv=64,
    d_ff=10240,
    num_layers=24,
    num_heads=64,
    relative_attention_num_buckets=32,
    relative_attention_max_distance=128,
    feed_forward_proj="gated-gelu",
    dropout_rate=0.0,
    is_encoder_decoder=False,
    pad_token_id=0,
    eos_token_id=1,
)
UMT5_XXL = dict(_T5_XXL, vocab_size=256384)
T5_V11_XXL = dict(_T5_XXL, vocab_size=32128)
# HunyuanVideo-1.5's encoders: Qwen2.5-VL-7B-Instruct's language model (the MLLM) and ByT5-small's encoder (glyphs).
QWEN25_VL_7B_TEXT = dict(
    vocab_size=152064,
    hidden_size=3584,
    intermediate_size=18944,
    num_hidden_layers=28,
    num_attention_heads=28,
    num_key_value_heads=4,
    max_position_embeddings=128000,
    rope_parameters={"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [16, 24, 24]},
)
BYT5_SMALL = dict(
    vocab_size=384,
    d_model=1472,
    d_kv=64,
    d_ff=3584,
    num_layers=12,
    num_heads=6,
    feed_forward_proj="gated-gelu",
    dropout_rate=0.0,
    is_encoder_decoder=False,
    pad_token_id=0,
    eos_token_id=1,
)

# Stable Diffusion XL 1.0 base (stabilityai/stable-diffusion-xl-base-1.0): its UNet, CLIP ViT-L/14 and OpenCLIP
# ViT-bigG/14 text encoders (the second with its projection), and its VAE.
SDXL_UNET = dict(
    sample_size=128,
    in_channels=4,
    out_channels=4,
    layers_per_block=2,
    block_out_channels=(320, 640, 1280),
    down_block_types=("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
    up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"),
    attention_head_dim=(5, 10, 20),
    transformer_layers_per_block=(1, 2, 10),
    cross_attention_dim=2048,
    use_linear_projection=True,
    addition_embed_type="text_time",
    addition_time_embed_dim=256,
    projection_class_embeddings_input_dim=2816,
)
CLIP_L = dict(
    hidden_size=768,
    intermediate_size=3072,
    num_attention_heads=12,
    num_hidden_layers=12,
    projection_dim=768,
    max_position_embeddings=77,
    vocab_size=49408,
    hidden_act="quick_gelu",
)
OPENCLIP_BIGG = dict(
    hidden_size=1280,
    intermediate_size=5120,
    num_attention_heads=20,
    num_hidden_layers=32,
    projection_dim=1280,
    max_position_embeddings=77,
    vocab_size=49408,
    hidden_act="gelu",
)
SDXL_VAE = dict(
    block_out_channels=(128, 256, 512, 512),
    down_block_types=("DownEncoderBlock2D",) * 4,
    up_block_types=("UpDecoderBlock2D",) * 4,
    layers_per_block=2,
    latent_channels=4,
    sample_size=1024,
    scaling_factor=0.13025,
    force_upcast=True,
)

# family, transformer / text encoder / VAE configs ({} = the diffusers class defaults, which are the real VAEs).
ARCHITECTURES = {
    "Wan2.1-1.3B": dict(
        family="wan", transformer=wan.WAN21_1_3B, text_encoder=UMT5_XXL, vae={}, flow_shift=3.0, vae_dtype=torch.float32
    ),
    "Wan2.1-14B": dict(
        family="wan", transformer=wan.WAN21_14B, text_encoder=UMT5_XXL, vae={}, flow_shift=5.0, vae_dtype=torch.float32
    ),
    "CogVideoX1.5-5B": dict(family="cogvideox", transformer=cogvideox.COGVIDEOX15_5B, text_encoder=T5_V11_XXL, vae={}),
    # the 480p text-to-video checkpoint; its 1000 MLLM + 256 ByT5 text tokens are the pipeline's own lengths
    "HunyuanVideo-1.5-8.3B": dict(
        family="hunyuanvideo15",
        transformer=hunyuan_video15.HUNYUANVIDEO15_8B,
        text_encoder=QWEN25_VL_7B_TEXT,
        text_encoder_2=BYT5_SMALL,
        vae={},
        flow_shift=5.0,
    ),
    # Wan2.1-1.3B run block-causally (Self-Forcing's recipe: 3 latent frames a block, every earlier frame attended)
    "CausalWan2.1-1.3B": dict(
        family="causal_wan",
        transformer=wan.WAN21_1_3B,
        text_encoder=UMT5_XXL,
        vae={},
        flow_shift=5.0,
        vae_dtype=torch.float32,
    ),
    # the VAE in float32, as SDXL's pipeline upcasts it to decode (force_upcast)
    "SDXL-1.0": dict(
        family="sdxl",
        unet=SDXL_UNET,
        text_encoder=CLIP_L,
        text_encoder_2=OPENCLIP_BIGG,
        vae=SDXL_VAE,
        vae_dtype=torch.float32,
    ),
}


_POOL_SIZE = (1 << 24) + 17  # odd: rows of power-of-two widths do not line up with the pool's period


def _normal_pool(generator: torch.Generator) -> torch.Tensor:
    """normal(0, 0.02) values drawn once per fill: parameters are filled by copying runs of them. Drawing every value
    with one generator is single-threaded (90 s for Wan2.1-1.3B with UMT5-XXL); copies take seconds."""
    return torch.empty(_POOL_SIZE, dtype=torch.float32).normal_(0.0, 0.02, generator=generator)


def _fill_from(value: torch.Tensor, pool: torch.Tensor, offset: int) -> int:
    """``value`` filled with the pool's values from ``offset`` on (wrapping round); returns the next offset."""
    flat, size, start = value.view(-1), pool.numel(), 0
    while start < flat.numel():
        run = min(flat.numel() - start, size - offset)
        flat[start : start + run].copy_(pool[offset : offset + run])
        start, offset = start + run, (offset + run) % size
    return offset


def fill_random(module: torch.nn.Module, dtype: torch.dtype, generator: torch.Generator | None) -> None:
    """Random weights: matrices normal(0, 0.02) (runs of one pool of values, drawn from ``generator``), vectors
    zeros (biases) or ones (norm scales). ``generator=None``: parameters stay on ``meta``, only their dtypes are set
    (as ``from_pretrained`` would)."""
    keep = getattr(module, "_keep_in_fp32_modules", None) or ()
    filled = {}  # tied parameters (a text encoder's input embedding and its shared table) stay one tensor
    pool = _normal_pool(generator) if generator is not None else None
    # each module starts at its own place in the pool (the generator's next draw), so two fills differ
    offset = int(torch.randint(_POOL_SIZE, (1,), generator=generator)) if generator is not None else 0
    for prefix, owner in module.named_modules(remove_duplicate=False):
        for name, param in list(owner._parameters.items()):
            if param is not None and id(param) in filled:
                owner._parameters[name] = filled[id(param)]
                continue
            if param is None or not param.is_meta:
                continue
            qualified = f"{prefix}.{name}" if prefix else name
            value = torch.empty(
                param.shape,
                dtype=torch.float32 if keep_in_fp32(qualified, keep) else dtype,
                device="cpu" if generator is not None else "meta",
            )
            if generator is not None and param.ndim >= 2:
                offset = _fill_from(value, pool, offset)
            elif generator is not None:
                value.fill_(0.0 if name == "bias" else 1.0)
            owner._parameters[name] = filled[id(param)] = torch.nn.Parameter(value, requires_grad=False)


def empty(build):
    with init_empty_weights(include_buffers=False):
        return build()


def build(name: str, dtype: torch.dtype = torch.bfloat16, seed: int = 0, weights: bool = True):
    """The named real-size pipeline (``ARCHITECTURES``) with random weights, on the CPU; ``weights=False``: its
    parameters stay on the ``meta`` device (shapes only, for ``plan``)."""
    if name not in ARCHITECTURES:
        raise ValueError(f"Unknown architecture {name!r}; choose one of {sorted(ARCHITECTURES)}.")

    spec = ARCHITECTURES[name]
    pipe = _BUILDERS[spec["family"]](spec)
    generator = torch.Generator().manual_seed(seed)
    # The denoiser and text encoders in ``dtype`` (keeping the models' float32 modules, as from_pretrained does);
    # the VAE as diffusers' examples load it: float32 for Wan, else ``dtype`` (CogVideoX's pipeline hands the
    # denoiser's latents to the VAE uncast, so they must agree).
    for component in ("transformer", "unet", "text_encoder", "text_encoder_2", "vae"):
        module = getattr(pipe, component, None)
        if module is not None:
            vae_dtype = spec.get("vae_dtype", dtype)
            if isinstance(module, transformers.PreTrainedModel):
                module.tie_weights()  # as from_pretrained does: T5's input embedding is its shared table (1B values)
            fill_random(module, vae_dtype if component == "vae" else dtype, generator if weights else None)
            module.eval()
    return pipe


def _wan(spec, causal: bool = False):

    model = CausalWanTransformer3DModel if causal else diffusers.WanTransformer3DModel
    parts = dict(
        transformer=empty(lambda: model(**spec["transformer"], **(CAUSAL_DEFAULTS if causal else {}))),
        vae=empty(lambda: diffusers.AutoencoderKLWan(**spec["vae"])),
        text_encoder=empty(lambda: UMT5EncoderModel(UMT5Config(**spec["text_encoder"]))),
        tokenizer=standins.char_tokenizer(),
    )
    if causal:
        return CausalWanPipeline(**parts, scheduler=diffusers.FlowMatchLCMScheduler(shift=spec["flow_shift"]))
    return diffusers.WanPipeline(
        **parts,
        scheduler=diffusers.UniPCMultistepScheduler(
            prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=spec["flow_shift"]
        ),
    )


def _cogvideox(spec):
    return diffusers.CogVideoXPipeline(
        transformer=empty(lambda: diffusers.CogVideoXTransformer3DModel(**spec["transformer"])),
        vae=empty(lambda: diffusers.AutoencoderKLCogVideoX(**spec["vae"])),
        text_encoder=empty(lambda: T5EncoderModel(T5Config(**spec["text_encoder"]))),
        tokenizer=standins.char_tokenizer(),
        scheduler=diffusers.CogVideoXDPMScheduler(**standins.COGVIDEOX_SCHEDULER),
    )


def _hunyuanvideo15(spec):
    return diffusers.HunyuanVideo15Pipeline(
        transformer=empty(lambda: diffusers.HunyuanVideo15Transformer3DModel(**spec["transformer"])),
        vae=empty(lambda: diffusers.AutoencoderKLHunyuanVideo15(**spec["vae"])),
        text_encoder=empty(lambda: Qwen2_5_VLTextModel(Qwen2_5_VLTextConfig(**spec["text_encoder"]))),
        tokenizer=standins.chat_tokenizer(),
        text_encoder_2=empty(lambda: T5EncoderModel(T5Config(**spec["text_encoder_2"]))),
        tokenizer_2=ByT5Tokenizer(),
        scheduler=diffusers.FlowMatchEulerDiscreteScheduler(shift=spec["flow_shift"]),
        guider=diffusers.ClassifierFreeGuidance(guidance_scale=6.0),
    )


def _sdxl(spec):
    return diffusers.StableDiffusionXLPipeline(
        unet=empty(lambda: diffusers.UNet2DConditionModel(**spec["unet"])),
        vae=empty(lambda: diffusers.AutoencoderKL(**spec["vae"])),
        text_encoder=empty(lambda: CLIPTextModel(CLIPTextConfig(**spec["text_encoder"]))),
        text_encoder_2=empty(lambda: CLIPTextModelWithProjection(CLIPTextConfig(**spec["text_encoder_2"]))),
        tokenizer=standins.char_tokenizer(77),
        tokenizer_2=standins.char_tokenizer(77),
        scheduler=diffusers.EulerDiscreteScheduler(
            beta_start=0.00085,
            beta_end=0.012,
            beta_schedule="scaled_linear",
            steps_offset=1,
            timestep_spacing="leading",
        ),
    )


_BUILDERS = {
    "wan": _wan,
    "causal_wan": lambda spec: _wan(spec, causal=True),
    "cogvideox": _cogvideox,
    "hunyuanvideo15": _hunyuanvideo15,
    "sdxl": _sdxl,
}


def folder_pipeline(folder: str, dtype: torch.dtype | None):
    """A local pipeline folder with its denoiser on the ``meta`` device (checked against the checkpoint, nothing
    read) and no text encoder: what ``plan`` needs, without the weights in host memory."""

    with open(os.path.join(folder, "model_index.json")) as handle:
        index = json.load(handle)
    model_class = getattr(diffusers, index["transformer"][1])
    transformer = loading.empty_model(model_class, os.path.join(folder, "transformer"), dtype)
    return getattr(diffusers, index["_class_name"]).from_pretrained(
        folder, transformer=transformer, text_encoder=None, tokenizer=None
    )
