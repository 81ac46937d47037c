"""Tiny offline HunyuanVideo 1.0 and HunyuanVideo-1.5 image-to-video pipelines (the 1.5 text-to-video one is
``tiny.hunyuan15_pipeline``)."""

from __future__ import annotations

import torch
import transformers
from diffusers import (
    AutoencoderKLHunyuanVideo,
    AutoencoderKLHunyuanVideo15,
    ClassifierFreeGuidance,
    FlowMatchEulerDiscreteScheduler,
    HunyuanVideo15ImageToVideoPipeline,
    HunyuanVideo15Pipeline,
    HunyuanVideo15Transformer3DModel,
    HunyuanVideoPipeline,
    HunyuanVideoTransformer3DModel,
)
from transformers import (
    ByT5Tokenizer,
    CLIPTextConfig,
    CLIPTextModel,
    LlamaConfig,
    LlamaModel,
    Qwen2_5_VLTextConfig,
    Qwen2_5_VLTextModel,
    SiglipVisionConfig,
    SiglipVisionModel,
)

from ..planner.standins import char_tokenizer, chat_tokenizer
from .tiny_parts import PROMPTS, test_image, tiny_t5

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


def hunyuan_video(seed: int = 0):
    """HunyuanVideo 1.0: a Llama text model (prompt template cut to 1 token) and CLIP (pooled), guidance-distilled
    transformer with double and single blocks; ``true_cfg_scale`` runs the real CFG pair."""
    torch.manual_seed(seed)
    transformer = HunyuanVideoTransformer3DModel(
        in_channels=4,
        out_channels=4,
        num_attention_heads=4,
        attention_head_dim=8,
        num_layers=2,
        num_single_layers=2,
        num_refiner_layers=2,
        patch_size=1,
        patch_size_t=1,
        guidance_embeds=True,
        text_embed_dim=16,
        pooled_projection_dim=8,
        rope_axes_dim=(2, 2, 4),
    )
    torch.manual_seed(seed + 1)
    vae = AutoencoderKLHunyuanVideo(
        in_channels=3,
        out_channels=3,
        latent_channels=4,
        down_block_types=("HunyuanVideoDownBlock3D",) * 4,
        up_block_types=("HunyuanVideoUpBlock3D",) * 4,
        block_out_channels=(8,) * 4,
        layers_per_block=1,
        act_fn="silu",
        norm_num_groups=4,
        scaling_factor=0.476986,
        spatial_compression_ratio=8,
        temporal_compression_ratio=4,
        mid_block_add_attention=True,
    )
    tokens = dict(bos_token_id=None, eos_token_id=1, pad_token_id=0, vocab_size=128)
    torch.manual_seed(seed + 2)
    text_encoder = LlamaModel(
        LlamaConfig(
            hidden_size=16,
            intermediate_size=37,
            num_attention_heads=4,
            num_key_value_heads=2,
            num_hidden_layers=2,
            **tokens,
        )
    ).eval()
    torch.manual_seed(seed + 3)
    text_encoder_2 = CLIPTextModel(
        CLIPTextConfig(
            hidden_size=8,
            intermediate_size=37,
            num_attention_heads=4,
            num_hidden_layers=2,
            projection_dim=8,
            max_position_embeddings=77,
            **tokens,
        )
    ).eval()
    pipe = HunyuanVideoPipeline(
        transformer=transformer.eval(),
        vae=vae.eval(),
        scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0),
        text_encoder=text_encoder,
        tokenizer=char_tokenizer(),
        text_encoder_2=text_encoder_2,
        tokenizer_2=char_tokenizer(77),
    )
    return pipe, dict(
        PROMPTS,
        prompt_template={"template": "<{}>", "crop_start": 1},
        true_cfg_scale=3.0,
        guidance_scale=4.5,
        height=16,
        width=16,
        num_frames=9,
        num_inference_steps=2,
        max_sequence_length=48,
    )


def hunyuan15_i2v(seed: int = 0):
    """HunyuanVideo-1.5 image-to-video: ``tiny.hunyuan15_pipeline``'s parts with an i2v transformer and a SigLIP image
    encoder of 4 semantic tokens (2x2 patches of a 12-pixel image)."""

    parts = hunyuan15_pipeline(seed).components
    torch.manual_seed(seed)
    parts["transformer"] = HunyuanVideo15Transformer3DModel(**dict(HUNYUAN15_TRANSFORMER, task_type="i2v")).eval()
    torch.manual_seed(seed + 4)
    parts["image_encoder"] = SiglipVisionModel(
        SiglipVisionConfig(
            hidden_size=12,
            intermediate_size=24,
            num_hidden_layers=2,
            num_attention_heads=2,
            image_size=12,
            patch_size=6,
        )
    ).eval()
    # the PIL backend: the default one needs torchvision, which has no CPU wheel here
    processor = getattr(transformers, "SiglipImageProcessorPil", transformers.SiglipImageProcessor)
    parts["feature_extractor"] = processor(size={"height": 12, "width": 12})
    pipe = HunyuanVideo15ImageToVideoPipeline(**parts)
    for name, value in dict(HUNYUAN15_LENGTHS, vision_num_semantic_tokens=4).items():
        setattr(pipe, name, value)
    # the video's size follows the image (and the transformer's target size)
    return pipe, dict(
        prompt='a cat holding a sign saying "hello" in the rain',
        negative_prompt="blurry",
        image=test_image(32, 48),
        num_frames=9,
        num_inference_steps=2,
    )
