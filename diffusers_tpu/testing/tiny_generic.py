"""Tiny offline pipelines that run on the generic path (no family file): Latte, Mochi and EasyAnimate, 2+ layers,
4 heads."""

from __future__ import annotations

import torch
from diffusers import (
    AutoencoderKL,
    AutoencoderKLMagvit,
    AutoencoderKLMochi,
    DDIMScheduler,
    EasyAnimatePipeline,
    EasyAnimateTransformer3DModel,
    FlowMatchEulerDiscreteScheduler,
    LattePipeline,
    LatteTransformer3DModel,
    MochiPipeline,
    MochiTransformer3DModel,
)
from transformers import Qwen2Config, Qwen2Model

from .tiny import char_tokenizer
from .tiny_parts import tiny_t5

PROMPTS = dict(
    prompt=["a squirrel eats", "a red fox jumps over the sleeping dog"], negative_prompt=["low", "low quality, static"]
)


def latte_pipeline(seed: int = 0):
    torch.manual_seed(seed)
    transformer = LatteTransformer3DModel(
        sample_size=8,
        num_layers=2,
        patch_size=2,
        attention_head_dim=8,
        num_attention_heads=4,
        caption_channels=32,
        in_channels=4,
        cross_attention_dim=32,
        out_channels=8,
        attention_bias=True,
        activation_fn="gelu-approximate",
        num_embeds_ada_norm=1000,
        norm_type="ada_norm_single",
        norm_elementwise_affine=False,
        norm_eps=1e-6,
        video_length=3,
    )
    torch.manual_seed(seed + 1)
    vae = AutoencoderKL(
        block_out_channels=(8, 8),
        down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2,
        norm_num_groups=2,
        latent_channels=4,
    )
    return LattePipeline(
        transformer=transformer.eval(),
        vae=vae.eval(),
        scheduler=DDIMScheduler(),
        text_encoder=tiny_t5(seed + 2),
        tokenizer=char_tokenizer(),
    )


def mochi_pipeline(seed: int = 0):
    torch.manual_seed(seed)
    transformer = MochiTransformer3DModel(
        patch_size=2,
        num_attention_heads=4,
        attention_head_dim=8,
        num_layers=2,
        pooled_projection_dim=16,
        in_channels=12,
        out_channels=None,
        qk_norm="rms_norm",
        text_embed_dim=32,
        time_embed_dim=4,
        activation_fn="swiglu",
        max_sequence_length=16,
    )
    torch.manual_seed(seed + 1)
    vae = AutoencoderKLMochi(
        latent_channels=12,
        out_channels=3,
        encoder_block_out_channels=(32,) * 4,
        decoder_block_out_channels=(32,) * 4,
        layers_per_block=(1,) * 5,
    )
    return MochiPipeline(
        transformer=transformer.eval(),
        vae=vae.eval(),
        scheduler=FlowMatchEulerDiscreteScheduler(),
        text_encoder=tiny_t5(seed + 2),
        tokenizer=char_tokenizer(),
    )


def easyanimate_pipeline(seed: int = 0):
    """EasyAnimate: its Magvit VAE keeps state on its causal convolutions between the decoder's calls
    (``interop.module_state``). A tiny Qwen2 text model stands in for Qwen2-VL's language model (the pipeline reads
    its second-to-last hidden states), the character tokenizer with a chat template for its messages."""
    torch.manual_seed(seed)
    transformer = EasyAnimateTransformer3DModel(
        num_attention_heads=4,
        attention_head_dim=16,
        in_channels=4,
        out_channels=4,
        time_embed_dim=8,
        text_embed_dim=32,
        num_layers=2,
        sample_width=16,
        sample_height=16,
        patch_size=2,
    )
    torch.manual_seed(seed + 1)
    vae = AutoencoderKLMagvit(
        in_channels=3,
        out_channels=3,
        latent_channels=4,
        layers_per_block=1,
        norm_num_groups=2,
        block_out_channels=(8, 8, 8, 8),
        spatial_group_norm=False,
        down_block_types=("SpatialDownBlock3D",) + ("SpatialTemporalDownBlock3D",) * 3,
        up_block_types=("SpatialUpBlock3D",) + ("SpatialTemporalUpBlock3D",) * 3,
    )
    torch.manual_seed(seed + 2)
    text_encoder = Qwen2Model(
        Qwen2Config(
            hidden_size=32,
            intermediate_size=32,
            num_hidden_layers=3,
            num_attention_heads=2,
            num_key_value_heads=2,
            vocab_size=128,
            max_position_embeddings=256,
            pad_token_id=0,
            eos_token_id=1,
        )
    ).eval()
    tokenizer = char_tokenizer()
    tokenizer.chat_template = (
        "{% for m in messages %}{% for c in m['content'] %}<{{ c['text'] }}>{% endfor %}{% endfor %}"
    )
    return EasyAnimatePipeline(
        vae=vae.eval(),
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        transformer=transformer.eval(),
        scheduler=FlowMatchEulerDiscreteScheduler(),
    )


PIPELINES = {"latte": latte_pipeline, "mochi": mochi_pipeline, "easyanimate": easyanimate_pipeline}
CALLS = {
    "LattePipeline": dict(
        PROMPTS,
        num_inference_steps=2,
        guidance_scale=5.0,
        height=16,
        width=16,
        video_length=3,
        clean_caption=False,
        output_type="np",
    ),
    "MochiPipeline": dict(
        PROMPTS,
        num_inference_steps=2,
        guidance_scale=4.5,
        height=16,
        width=16,
        num_frames=7,
        max_sequence_length=16,
        output_type="np",
    ),
    "EasyAnimatePipeline": dict(
        PROMPTS, num_inference_steps=2, guidance_scale=5.0, height=16, width=16, num_frames=5, output_type="np"
    ),
}


def generic_pipeline(name: str, seed: int = 0):
    if name not in PIPELINES:
        raise ValueError(f"No tiny generic-path pipeline {name!r}; choose one of {sorted(PIPELINES)}.")
    return PIPELINES[name](seed)


def generic_call(pipe) -> dict:
    """Call arguments that suit the tiny pipeline (two prompts of different lengths, CFG on)."""
    return dict(CALLS[type(pipe).__name__])
