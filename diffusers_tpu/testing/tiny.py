"""Tiny random-weight pipeline components built offline (no hub access): for tests, the CLI default and notebooks.

The tokenizer is a character-level WordLevel model built with the `tokenizers` library, so prompts of different
lengths pad differently, exactly what masking and padding bugs need to be seen.

The parts they are built from (text encoders, image processors, helpers) are ``tiny_parts``.
"""

from __future__ import annotations

import torch
import transformers
from diffusers import (
    AutoencoderKLCogVideoX,
    AutoencoderKLWan,
    CogVideoXDDIMScheduler,
    CogVideoXDPMScheduler,
    CogVideoXPipeline,
    CogVideoXTransformer3DModel,
    DDIMScheduler,
    FlowMatchEulerDiscreteScheduler,
    FlowMatchLCMScheduler,
    UniPCMultistepScheduler,
    WanImageToVideoPipeline,
    WanPipeline,
    WanTransformer3DModel,
)
from transformers import (
    CLIPVisionConfig,
    CLIPVisionModel,
)

from ..families.causal_wan import CausalWanTransformer3DModel
from ..families.causal_wan_pipeline import CausalWanPipeline
from ..planner.standins import COGVIDEOX_SCHEDULER, HUNYUAN15_TEMPLATE_TOKENS, char_tokenizer, chat_tokenizer  # noqa: F401
from .tiny_hunyuan import hunyuan15_pipeline  # noqa: F401 - the notebooks call it as tiny.hunyuan15_pipeline
from .tiny_parts import (
    tiny_t5,
    tiny_umt5,
)

# Transformer shapes parity is tested on: "wan-4head" has heads that tp=4 divides (8-device mesh); "wan-d128"
# the real models' head size.
WAN_TRANSFORMERS = {
    "wan": dict(
        patch_size=(1, 2, 2),
        num_attention_heads=2,
        attention_head_dim=12,
        in_channels=16,
        out_channels=16,
        text_dim=32,
        freq_dim=256,
        ffn_dim=32,
        num_layers=2,
        cross_attn_norm=True,
        qk_norm="rms_norm_across_heads",
        rope_max_seq_len=32,
    ),
    "wan-4head": dict(
        patch_size=(1, 2, 2),
        num_attention_heads=4,
        attention_head_dim=8,
        in_channels=16,
        out_channels=16,
        text_dim=32,
        freq_dim=64,
        ffn_dim=48,
        num_layers=3,
        cross_attn_norm=False,
        qk_norm="rms_norm_across_heads",
        rope_max_seq_len=32,
    ),
}
# head_dim 128, a lane multiple: the exp2 kernel reads q/k/v packed as [B, S, H*D] (the real models' layout)
WAN_TRANSFORMERS["wan-d128"] = dict(
    WAN_TRANSFORMERS["wan-4head"], attention_head_dim=128, ffn_dim=64, num_layers=2, cross_attn_norm=True
)
# a step that dominates a CPU run (8 blocks of 512 wide, ~20 GFLOP a forward at 128x128x17): ``bench --cache``'s
# ratio of work is measured on it, not on the dispatch-bound tiny models
WAN_TRANSFORMERS["wan-step"] = dict(
    WAN_TRANSFORMERS["wan-4head"], num_attention_heads=8, attention_head_dim=64, ffn_dim=2048, num_layers=8
)
WAN_VAE = dict(base_dim=3, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1, temperal_downsample=[False, True, True])
# Wan 2.2 TI2V-5B: a 48-channel residual VAE that works on 2x2 pixel patches (16x spatial compression).
WAN22_VAE = dict(
    base_dim=8,
    decoder_base_dim=8,
    z_dim=48,
    dim_mult=[1, 1, 1, 1],
    num_res_blocks=1,
    temperal_downsample=[False, True, True],
    is_residual=True,
    in_channels=12,
    out_channels=12,
    patch_size=2,
    scale_factor_spatial=16,
    latents_mean=[0.0] * 48,
    latents_std=[1.0] * 48,
)
WAN22_TI2V_TRANSFORMER = dict(WAN_TRANSFORMERS["wan-4head"], in_channels=48, out_channels=48, num_layers=2)
# Wan 2.1 I2V: 36 input channels (noise 16 + frame mask 4 + image latents 16), CLIP image tokens in cross-attention.
WAN_I2V_TRANSFORMER = dict(
    WAN_TRANSFORMERS["wan-4head"], in_channels=36, out_channels=16, num_layers=2, image_dim=16, added_kv_proj_dim=32
)
CLIP_VISION = dict(
    hidden_size=16,
    projection_dim=16,
    num_hidden_layers=2,
    num_attention_heads=2,
    image_size=32,
    intermediate_size=32,
    patch_size=8,
)


_COGVIDEOX = dict(
    num_attention_heads=4,
    attention_head_dim=8,
    in_channels=4,
    out_channels=4,
    time_embed_dim=8,
    text_embed_dim=32,
    num_layers=2,
    sample_width=8,
    sample_height=8,
    sample_frames=9,
    patch_size=2,
    temporal_compression_ratio=4,
    max_text_seq_length=32,
)
# 1.0 as CogVideoX-2b (sincos positions) and -5b (RoPE: head_dim splits in even t/h/w parts); 1.5 adds
# temporal patches (patch_size_t=2).
COGVIDEOX_TRANSFORMERS = {
    "cogvideox-2b": dict(_COGVIDEOX),
    "cogvideox-5b": dict(_COGVIDEOX, num_layers=3, attention_head_dim=16, use_rotary_positional_embeddings=True),
    "cogvideox1.5": dict(
        _COGVIDEOX, attention_head_dim=16, patch_size_t=2, patch_bias=False, use_rotary_positional_embeddings=True
    ),
    # the real models' 64-wide heads: the exp2 kernel reads them packed, two heads to a 128-lane tile
    "cogvideox-d64": dict(_COGVIDEOX, attention_head_dim=64, use_rotary_positional_embeddings=True),
}
# CogVideoX 1.5 whose step dominates a CPU run (8 blocks of 512 wide), as ``wan-step``: ``bench --cache`` on a pipeline
# that batches the guidance pair itself (FasterCache's case)
COGVIDEOX_TRANSFORMERS["cogvideox-step"] = dict(
    COGVIDEOX_TRANSFORMERS["cogvideox1.5"],
    num_attention_heads=8,
    attention_head_dim=64,
    num_layers=8,
    sample_height=16,  # its rotary grid's size at 128x128 (1.5 slices the grid to this)
    sample_width=16,
)
COGVIDEOX_VAE = dict(
    in_channels=3,
    out_channels=3,
    down_block_types=("CogVideoXDownBlock3D",) * 4,
    up_block_types=("CogVideoXUpBlock3D",) * 4,
    block_out_channels=(8, 8, 8, 8),
    latent_channels=4,
    layers_per_block=1,
    norm_num_groups=2,
    temporal_compression_ratio=4,
)


# Two prompts of different lengths (and different negative prompts) in one batch: both get padded to
# max_sequence_length, so padding and batching bugs show. The tiny Wan's call in the tests and in the installed
# wheel's parity check (tests/workers/shared_device_worker.py).
WAN_CALL = dict(
    prompt=["a cat walks on the grass", "a red fox jumps over a sleeping dog in the snow"],
    negative_prompt=["blurry", "low quality, static, deformed"],
    height=32,
    width=32,
    num_frames=9,
    num_inference_steps=3,
)


def wan_components(variant: str = "wan", seed: int = 0, scheduler: str = "flow_match") -> dict:
    """Components for ``diffusers.WanPipeline(**components)``; ``scheduler``: "flow_match" or "unipc"."""
    if variant not in WAN_TRANSFORMERS:
        raise ValueError(f"Unknown tiny Wan variant {variant!r}; choose one of {sorted(WAN_TRANSFORMERS)}.")
    torch.manual_seed(seed)
    transformer = WanTransformer3DModel(**WAN_TRANSFORMERS[variant]).eval()
    torch.manual_seed(seed + 1)
    vae = AutoencoderKLWan(**WAN_VAE).eval()
    if scheduler == "flow_match":
        sched = FlowMatchEulerDiscreteScheduler(shift=7.0)
    elif scheduler == "unipc":
        sched = UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=3.0)
    else:
        raise ValueError(f"Unknown scheduler {scheduler!r}; choose 'flow_match' or 'unipc'.")
    return dict(
        transformer=transformer,
        vae=vae,
        scheduler=sched,
        text_encoder=tiny_umt5(seed + 2),
        tokenizer=char_tokenizer(),
    )


def wan_pipeline(variant: str = "wan", seed: int = 0, scheduler: str = "flow_match", cls=None):
    """A tiny stock ``diffusers.WanPipeline`` (or ``cls``) on CPU."""
    cls = WanPipeline if cls is None else cls
    return cls(**wan_components(variant, seed, scheduler))


def wan22_a14b_pipeline(seed: int = 0, scheduler: str = "unipc"):
    """Wan 2.2 A14B in miniature: two transformers (high-noise, low-noise) switching at the boundary timestep."""
    components = wan_components("wan-4head", seed, scheduler)
    torch.manual_seed(seed + 10)
    components["transformer_2"] = WanTransformer3DModel(**WAN_TRANSFORMERS["wan-4head"]).eval()
    return WanPipeline(**components, boundary_ratio=0.875)


def wan22_ti2v_pipeline(seed: int = 0, scheduler: str = "unipc"):
    """Wan 2.2 TI2V-5B in miniature: the 48-channel VAE and per-token timesteps (``expand_timesteps``)."""
    components = wan_components("wan-4head", seed, scheduler)
    torch.manual_seed(seed)
    components["transformer"] = WanTransformer3DModel(**WAN22_TI2V_TRANSFORMER).eval()
    torch.manual_seed(seed + 1)
    components["vae"] = AutoencoderKLWan(**WAN22_VAE).eval()
    return WanPipeline(**components, expand_timesteps=True)


def wan_i2v_pipeline(seed: int = 0, scheduler: str = "unipc", first_last: bool = False):
    """Wan 2.1 image-to-video in miniature: a CLIP vision encoder and image tokens in cross-attention.
    ``first_last``: the first-last-frame model (``last_image=``: two images' tokens a sample, position-embedded)."""
    # the PIL backend: the default one needs torchvision, which has no CPU wheel here
    processor_cls = getattr(transformers, "CLIPImageProcessorPil", transformers.CLIPImageProcessor)

    components = wan_components("wan-4head", seed, scheduler)
    torch.manual_seed(seed)
    extra = dict(pos_embed_seq_len=2 * ((32 // 8) ** 2 + 1)) if first_last else {}  # CLIP_VISION's tokens, twice
    components["transformer"] = WanTransformer3DModel(**WAN_I2V_TRANSFORMER, **extra).eval()
    torch.manual_seed(seed + 3)
    components["image_encoder"] = CLIPVisionModel(CLIPVisionConfig(**CLIP_VISION)).eval()
    components["image_processor"] = processor_cls(crop_size=32, size=32)
    return WanImageToVideoPipeline(**components)


# Causal Wan in miniature: blocks of 2 latent frames, 1 sink frame and a 2-frame window, so a 3-block video
# already wraps the ring buffer.
CAUSAL_WAN = dict(num_frame_per_block=2, sink_size=1, local_attn_size=2)


def causal_wan_pipeline(seed: int = 0, **causal):
    """A tiny ``diffusers_tpu.CausalWanPipeline`` on CPU (the "wan-4head" weights; ``causal`` overrides
    ``CAUSAL_WAN``)."""

    components = wan_components("wan-4head", seed)
    components["transformer"] = CausalWanTransformer3DModel.from_transformer(
        components["transformer"], **{**CAUSAL_WAN, **causal}
    )
    components["scheduler"] = FlowMatchLCMScheduler(shift=5.0)
    return CausalWanPipeline(**components)


def save_wan_pipeline(path, variant: str = "wan", seed: int = 0, scheduler: str = "flow_match") -> str:
    """Write a tiny Wan pipeline as a local diffusers folder (safetensors) usable with ``from_pretrained``."""
    wan_pipeline(variant, seed, scheduler).save_pretrained(str(path), safe_serialization=True)
    return str(path)


def cogvideox_components(variant: str = "cogvideox-5b", seed: int = 0, scheduler: str = "dpm") -> dict:
    """Components for ``diffusers.CogVideoXPipeline``; ``scheduler``: "dpm", "ddim" or "cogvideox_ddim".
    Call the pipeline with ``max_sequence_length=32`` (the tiny transformer's text length)."""
    if variant not in COGVIDEOX_TRANSFORMERS:
        raise ValueError(f"Unknown tiny CogVideoX variant {variant!r}; choose one of {sorted(COGVIDEOX_TRANSFORMERS)}.")
    schedulers = {"dpm": CogVideoXDPMScheduler, "ddim": DDIMScheduler, "cogvideox_ddim": CogVideoXDDIMScheduler}
    if scheduler not in schedulers:
        raise ValueError(f"Unknown scheduler {scheduler!r}; choose one of {sorted(schedulers)}.")
    torch.manual_seed(seed)
    transformer = CogVideoXTransformer3DModel(**COGVIDEOX_TRANSFORMERS[variant]).eval()
    torch.manual_seed(seed + 1)
    vae = AutoencoderKLCogVideoX(**COGVIDEOX_VAE).eval()
    return dict(
        transformer=transformer,
        vae=vae,
        scheduler=schedulers[scheduler](**COGVIDEOX_SCHEDULER),
        text_encoder=tiny_t5(seed + 2),
        tokenizer=char_tokenizer(),
    )


def cogvideox_pipeline(variant: str = "cogvideox-5b", seed: int = 0, scheduler: str = "dpm", cls=None):
    """A tiny stock ``diffusers.CogVideoXPipeline`` (or ``cls``) on CPU."""
    cls = CogVideoXPipeline if cls is None else cls
    return cls(**cogvideox_components(variant, seed, scheduler))
