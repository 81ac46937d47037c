"""Tiny random-weight pipeline components built offline (no hub access): for tests, the CLI default and notebooks.

The tokenizer is a character-level WordLevel model built with the `tokenizers` library, so prompts of different
lengths pad differently, exactly what masking and padding bugs need to be seen.

Over 400 lines: the tiny configurations as data, one argument a line as ``ruff format`` lays them.
"""

from __future__ import annotations

import inspect

import diffusers
import numpy as np
import PIL.Image
import torch
import transformers
from diffusers import (
    AutoencoderKL,
    AutoencoderKLCogVideoX,
    AutoencoderKLHunyuanVideo15,
    AutoencoderKLWan,
    ClassifierFreeGuidance,
    CogVideoXDDIMScheduler,
    CogVideoXDPMScheduler,
    CogVideoXPipeline,
    CogVideoXTransformer3DModel,
    DDIMScheduler,
    FlowMatchEulerDiscreteScheduler,
    FlowMatchLCMScheduler,
    HunyuanVideo15Pipeline,
    HunyuanVideo15Transformer3DModel,
    PriorTransformer,
    UniPCMultistepScheduler,
    WanImageToVideoPipeline,
    WanPipeline,
    WanTransformer3DModel,
)
from transformers import (
    ByT5Tokenizer,
    CLIPTextConfig,
    CLIPTextModel,
    CLIPTextModelWithProjection,
    CLIPVisionConfig,
    CLIPVisionModel,
    CLIPVisionModelWithProjection,
    Gemma2Config,
    Gemma2Model,
    Qwen2_5_VLTextConfig,
    Qwen2_5_VLTextModel,
    T5Config,
    T5EncoderModel,
    UMT5Config,
    UMT5EncoderModel,
)

from ..families.causal_wan import CausalWanTransformer3DModel
from ..families.causal_wan_pipeline import CausalWanPipeline
from ..planner.standins import COGVIDEOX_SCHEDULER, HUNYUAN15_TEMPLATE_TOKENS, char_tokenizer, chat_tokenizer  # noqa: F401

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
UMT5 = dict(
    vocab_size=384,
    d_model=32,
    d_kv=8,
    d_ff=64,
    num_layers=2,
    num_heads=4,
    relative_attention_num_buckets=8,
    relative_attention_max_distance=32,
    dropout_rate=0.0,
    feed_forward_proj="gated-gelu",
    is_encoder_decoder=False,
    pad_token_id=0,
    eos_token_id=1,
    decoder_start_token_id=0,
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


def tiny_umt5(seed: int = 0):
    torch.manual_seed(seed)
    return UMT5EncoderModel(UMT5Config(**UMT5)).eval()


def tiny_t5(seed: int = 0):
    torch.manual_seed(seed)
    config = {k: v for k, v in UMT5.items() if k != "is_encoder_decoder"}
    return T5EncoderModel(T5Config(**config)).eval()


def tiny_clip(seed: int, hidden: int = 32, projection: bool = False):
    """A CLIP text encoder for the character tokenizer (pad 0, eos 1): pooled at the eos token; with ``projection``
    the class with a text projection (SDXL's second encoder, unCLIP priors)."""
    torch.manual_seed(seed)
    config = CLIPTextConfig(
        hidden_size=hidden,
        intermediate_size=37,
        num_attention_heads=4,
        num_hidden_layers=2,
        projection_dim=hidden,
        max_position_embeddings=77,
        vocab_size=128,
        bos_token_id=None,
        eos_token_id=1,
        pad_token_id=0,
    )
    return (CLIPTextModelWithProjection if projection else CLIPTextModel)(config).eval()


def tiny_clip_vision(seed: int, hidden: int = 32):
    """A CLIP vision encoder with a projection for 32-px images (8-px patches), 2 layers, 4 heads."""
    torch.manual_seed(seed)
    return CLIPVisionModelWithProjection(
        CLIPVisionConfig(
            hidden_size=hidden,
            intermediate_size=37,
            num_attention_heads=4,
            num_hidden_layers=2,
            projection_dim=hidden,
            image_size=32,
            patch_size=8,
        )
    ).eval()


def tiny_gemma2(seed: int):
    """A Gemma 2 text model, 32 wide, 2 layers (Sana, Sana Video, SANA-WM)."""
    return seeded(
        seed,
        lambda: Gemma2Model(
            Gemma2Config(
                hidden_size=32,
                intermediate_size=32,
                num_hidden_layers=2,
                num_attention_heads=2,
                num_key_value_heads=1,
                head_dim=16,
                vocab_size=128,
                max_position_embeddings=256,
                pad_token_id=0,
                eos_token_id=1,
                bos_token_id=2,
            )
        ),
    )


def clip_image_processor():
    """CLIP's image processor at 32 px (its PIL class where torchvision, which the default needs, is absent)."""
    return getattr(transformers, "CLIPImageProcessorPil", transformers.CLIPImageProcessor)(crop_size=32, size=32)


def tiny_prior(seed: int):
    """An unCLIP prior (``PriorTransformer``): CLIP text states to a 32-wide image embedding, 2 layers."""
    torch.manual_seed(seed)
    return PriorTransformer(num_attention_heads=2, attention_head_dim=16, embedding_dim=32, num_layers=2).eval()


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


def test_image(height: int = 32, width: int = 32, seed: int = 0):
    """A deterministic RGB PIL image (for image-to-video)."""
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    return PIL.Image.fromarray(pixels)


def test_mask(height: int = 32, width: int = 32):
    """A PIL mask with its right half set (for inpainting)."""
    return PIL.Image.fromarray(((np.arange(width)[None, :] > width // 2) * 255).astype(np.uint8).repeat(height, 0))


def seeded(seed: int, build):
    """``build()`` under ``torch.manual_seed(seed)``, in eval mode."""
    torch.manual_seed(seed)
    return build().eval()


def kl_vae(seed: int, latent_channels: int = 4, blocks: int = 2, **extra):
    """A tiny ``AutoencoderKL`` (8 channels a block); SD3-style shift and scaling factors unless ``extra`` says."""
    extra = dict(dict(shift_factor=0.0609, scaling_factor=1.5035), **extra)  # SD3-style pipelines read both
    return seeded(
        seed,
        lambda: AutoencoderKL(
            block_out_channels=(8,) * blocks,
            down_block_types=("DownEncoderBlock2D",) * blocks,
            up_block_types=("UpDecoderBlock2D",) * blocks,
            norm_num_groups=2,
            latent_channels=latent_channels,
            **extra,
        ),
    )


def rebuilt(seed: int, model, **changes):
    """A fresh model of ``model``'s class and config with ``changes`` (``from_config`` would keep a changed value
    that the original left at its default at that default: it reads ``_use_default_values``)."""
    config = {k: v for k, v in model.config.items() if not k.startswith("_")}
    return seeded(seed, lambda: type(model).from_config(dict(config, **changes)))


def fit(cls_name: str, parts: dict, call: dict):
    """The diffusers class ``cls_name`` built from the parts its constructor takes, and the call arguments its
    ``__call__`` takes (a family's classes differ in both: no negative prompt for LCM, no image encoder for
    InstructPix2Pix...)."""

    cls = getattr(diffusers, cls_name)
    built = set(inspect.signature(cls.__init__).parameters)
    called = set(inspect.signature(cls.__call__).parameters)
    return cls(**{k: v for k, v in parts.items() if k in built}), {k: v for k, v in call.items() if k in called}


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


# HunyuanVideo-1.5 in miniature: a Qwen2.5-VL text model (the MLLM encoder), ByT5 for quoted glyph text, the
# 1.5 VAE (8x spatial here instead of 16x, so tiny frames keep a few tokens per latent frame).
HUNYUAN15_TRANSFORMER = dict(
    in_channels=9,
    out_channels=4,
    num_attention_heads=4,
    attention_head_dim=8,
    num_layers=2,
    num_refiner_layers=2,
    mlp_ratio=2.0,
    text_embed_dim=16,
    text_embed_2_dim=32,
    image_embed_dim=12,
    rope_axes_dim=(2, 2, 4),
    target_size=32,
    task_type="t2v",
)
HUNYUAN15_VAE = dict(
    latent_channels=4,
    block_out_channels=(8, 8, 8, 8),
    layers_per_block=1,
    spatial_compression_ratio=8,
    temporal_compression_ratio=4,
)
QWEN25_VL_TEXT = dict(
    vocab_size=128,
    hidden_size=16,
    intermediate_size=32,
    num_hidden_layers=3,
    num_attention_heads=2,
    num_key_value_heads=1,
    max_position_embeddings=512,
    # transformers 4.57's names (5.x reads them too: its ``rope_parameters`` alone leaves 4.57 without mrope sections)
    rope_scaling={"mrope_section": [1, 1, 2], "rope_type": "default", "type": "default"},
    rope_theta=10000.0,
    bos_token_id=None,
    eos_token_id=1,
    pad_token_id=0,
)
# The stock pipeline crops this many template tokens (its system prompt) off the encoder output.
# The stock lengths (1000 MLLM tokens, 256 ByT5 tokens, 729 image tokens) shortened for CPU tests.
HUNYUAN15_LENGTHS = dict(tokenizer_max_length=40, tokenizer_2_max_length=24, vision_num_semantic_tokens=6)


def hunyuan15_pipeline(seed: int = 0, cls=None):
    """A tiny stock ``diffusers.HunyuanVideo15Pipeline`` (or ``cls``) on CPU, text lengths shortened
    (``HUNYUAN15_LENGTHS``). Quoted text in a prompt (``'a sign saying "hi"'``) goes through ByT5."""
    cls = HunyuanVideo15Pipeline if cls is None else cls
    torch.manual_seed(seed)
    transformer = HunyuanVideo15Transformer3DModel(**HUNYUAN15_TRANSFORMER).eval()
    torch.manual_seed(seed + 1)
    vae = AutoencoderKLHunyuanVideo15(**HUNYUAN15_VAE).eval()
    torch.manual_seed(seed + 2)
    text_encoder = Qwen2_5_VLTextModel(Qwen2_5_VLTextConfig(**QWEN25_VL_TEXT)).eval()
    pipe = cls(
        transformer=transformer,
        vae=vae,
        scheduler=FlowMatchEulerDiscreteScheduler(shift=5.0),
        text_encoder=text_encoder,
        tokenizer=chat_tokenizer(),
        text_encoder_2=tiny_t5(seed + 3),
        tokenizer_2=ByT5Tokenizer(),
        guider=ClassifierFreeGuidance(guidance_scale=6.0),
    )
    for name, value in HUNYUAN15_LENGTHS.items():
        setattr(pipe, name, value)
    return pipe


class PassThroughGuardrail(torch.nn.Module):
    """Stands in for Cosmos' guardrail (the ``cosmos_guardrail`` package, not installed here): every prompt and
    video passes unchanged. Stock refuses to run without a checker; this one changes no value, so the comparison
    is of the pipeline itself."""

    def __init__(self):
        super().__init__()
        self.register_buffer("_where", torch.zeros(()), persistent=False)  # the pipeline asks its modules' device

    @property
    def device(self) -> torch.device:
        return self._where.device

    @property
    def dtype(self) -> torch.dtype:
        return self._where.dtype

    def check_text_safety(self, prompt: str) -> bool:
        return True

    def check_video_safety(self, frames):
        return frames
