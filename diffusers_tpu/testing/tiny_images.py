"""Tiny offline image pipelines (Flux, Qwen-Image, Z-Image, NucleusMoE-Image): 2+ layers, 4 heads, prompts of
different lengths.
``(pipe, call arguments)`` like ``tiny_families``."""

from __future__ import annotations

import torch
from diffusers import (
    AutoencoderKL,
    AutoencoderKLQwenImage,
    FlowMatchEulerDiscreteScheduler,
    FluxPipeline,
    FluxTransformer2DModel,
    QwenImagePipeline,
    QwenImageTransformer2DModel,
    ZImagePipeline,
    ZImageTransformer2DModel,
)
from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration, Qwen3Config, Qwen3Model

from .tiny import char_tokenizer
from .tiny_parts import seeded, tiny_clip, tiny_t5, vl_processor

PROMPTS = dict(
    prompt=["a cat on the grass", "a red fox jumps over a sleeping dog in the snow"],
    negative_prompt=["blurry", "low quality, deformed"],
)


def flux(seed: int = 0):
    torch.manual_seed(seed)
    transformer = FluxTransformer2DModel(
        patch_size=1,
        in_channels=4,
        num_layers=2,
        num_single_layers=2,
        attention_head_dim=16,
        num_attention_heads=4,
        joint_attention_dim=32,
        pooled_projection_dim=32,
        axes_dims_rope=[4, 4, 8],
    )
    torch.manual_seed(seed + 1)
    vae = AutoencoderKL(
        sample_size=32,
        in_channels=3,
        out_channels=3,
        block_out_channels=(4,),
        layers_per_block=1,
        latent_channels=1,
        norm_num_groups=1,
        use_quant_conv=False,
        use_post_quant_conv=False,
        shift_factor=0.0609,
        scaling_factor=1.5035,
    )
    pipe = FluxPipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(),
        text_encoder=tiny_clip(seed + 2),
        tokenizer=char_tokenizer(77),
        text_encoder_2=tiny_t5(seed + 3),
        tokenizer_2=char_tokenizer(),
        transformer=transformer.eval(),
        vae=vae.eval(),
        image_encoder=None,
        feature_extractor=None,
    )
    # true CFG (a negative prompt and true_cfg_scale > 1): two transformer passes per step, paired over dp
    return pipe, dict(
        PROMPTS,
        true_cfg_scale=2.0,
        guidance_scale=5.0,
        height=16,
        width=16,
        num_inference_steps=2,
        max_sequence_length=48,
    )


def qwen_image(seed: int = 0):
    torch.manual_seed(seed)
    transformer = QwenImageTransformer2DModel(
        patch_size=2,
        in_channels=16,
        out_channels=4,
        num_layers=2,
        attention_head_dim=16,
        num_attention_heads=4,
        joint_attention_dim=16,
        guidance_embeds=False,
        axes_dims_rope=(8, 4, 4),
    )
    torch.manual_seed(seed + 1)
    vae = AutoencoderKLQwenImage(
        base_dim=24,
        z_dim=4,
        dim_mult=[1, 2, 4],
        num_res_blocks=1,
        temperal_downsample=[False, True],
        latents_mean=[0.0] * 4,
        latents_std=[1.0] * 4,
    )
    torch.manual_seed(seed + 2)
    text = dict(
        hidden_size=16,
        intermediate_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        rope_scaling={"mrope_section": [1, 1, 2], "rope_type": "default", "type": "default"},
        rope_theta=1000000.0,
    )
    vision = dict(depth=2, hidden_size=16, intermediate_size=16, num_heads=2, out_hidden_size=16)
    text_encoder = Qwen2_5_VLForConditionalGeneration(
        Qwen2_5_VLConfig(
            text_config=text,
            vision_config=vision,
            hidden_size=16,
            vocab_size=128,
            pad_token_id=0,
            eos_token_id=1,
            vision_start_token_id=125,
            vision_end_token_id=126,
            vision_token_id=127,
        )
    ).eval()
    pipe = QwenImagePipeline(
        transformer=transformer.eval(),
        vae=vae.eval(),
        scheduler=FlowMatchEulerDiscreteScheduler(),
        text_encoder=text_encoder,
        tokenizer=char_tokenizer(),
    )
    # The stock template's system prompt is ~150 characters here (a character tokenizer): a short one of the same
    # shape keeps the tiny prompts apart (the first 3 tokens are dropped, as stock drops its template's 34).
    pipe.prompt_template_encode, pipe.prompt_template_encode_start_idx = "<s>{}<e>", 3
    return pipe, dict(PROMPTS, true_cfg_scale=2.0, height=32, width=32, num_inference_steps=2, max_sequence_length=48)


def z_image(seed: int = 0, dim: int = 48, heads: int = 4, axes_dims=(4, 4, 4)):
    """``dim=32, heads=2, axes_dims=(8, 4, 4)``: diffusers' own test size, whose MLP width (85) tp=2 does not
    divide."""
    torch.manual_seed(seed)
    transformer = ZImageTransformer2DModel(
        all_patch_size=(2,),
        all_f_patch_size=(1,),
        in_channels=16,
        dim=dim,
        n_layers=2,
        n_refiner_layers=1,
        n_heads=heads,
        n_kv_heads=heads,
        norm_eps=1e-5,
        qk_norm=True,
        cap_feat_dim=16,
        rope_theta=256.0,
        t_scale=1000.0,
        axes_dims=list(axes_dims),
        axes_lens=[256, 32, 32],
    )  # MLP width int(48 / 3 * 8) = 128: tp=4 divides it
    with torch.no_grad():  # created with torch.empty in stock: fixed values, as diffusers' tests do
        transformer.x_pad_token.copy_(torch.ones_like(transformer.x_pad_token))
        transformer.cap_pad_token.copy_(torch.ones_like(transformer.cap_pad_token))
    torch.manual_seed(seed + 1)
    vae = AutoencoderKL(
        in_channels=3,
        out_channels=3,
        down_block_types=["DownEncoderBlock2D"] * 2,
        up_block_types=["UpDecoderBlock2D"] * 2,
        block_out_channels=[32, 64],
        layers_per_block=1,
        latent_channels=16,
        norm_num_groups=32,
        sample_size=32,
        scaling_factor=0.3611,
        shift_factor=0.1159,
    )
    torch.manual_seed(seed + 2)
    text_encoder = Qwen3Model(
        Qwen3Config(
            hidden_size=16,
            intermediate_size=16,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=2,
            vocab_size=128,
            max_position_embeddings=512,
            pad_token_id=0,
            eos_token_id=1,
        )
    ).eval()
    tokenizer = char_tokenizer()
    tokenizer.chat_template = "{% for m in messages %}<{{ m['content'] }}>{% endfor %}"
    pipe = ZImagePipeline(
        transformer=transformer.eval(),
        vae=vae.eval(),
        scheduler=FlowMatchEulerDiscreteScheduler(),
        text_encoder=text_encoder,
        tokenizer=tokenizer,
    )
    return pipe, dict(
        PROMPTS,
        guidance_scale=3.0,
        cfg_normalization=False,
        cfg_truncation=1.0,
        height=32,
        width=32,
        num_inference_steps=2,
        max_sequence_length=64,
    )


# Qwen3-VL's vision tokens, and a chat template of stock's shape: the system prompt cut to 6 characters (a character
# tokenizer would make stock's ~300 tokens), then the user's text parts
QWEN3_VL_TOKENS = ("<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>")
SHORT_CHAT = (
    "{% for m in messages %}<{% if m['content'] is string %}{{ m['content'][:6] }}{% else %}"
    "{% for c in m['content'] %}{{ c['text'] }}{% endfor %}{% endif %}>{% endfor %}"
)


def nucleusmoe_image(seed: int = 0, dense_moe_strategy: str = "leave_first_block_dense"):
    """NucleusMoE-Image (diffusers 0.42+): a Qwen3-VL text encoder (8 layers: stock reads the states 8 from the
    last), three single-stream blocks — one dense, two of 4 experts with expert-choice routing (``"all_moe"``: three
    of experts, one loop) — and grouped-query attention (4 heads, 2 key/value heads); Qwen-Image's VAE."""
    import diffusers  # noqa: PLC0415 (diffusers < 0.42 has no NucleusMoE-Image; the other builders need none)

    if not hasattr(diffusers, "NucleusMoEImagePipeline"):
        raise ValueError(f"NucleusMoE-Image is in diffusers 0.42 and later, not {diffusers.__version__}.")
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration, Qwen3VLProcessor  # noqa: PLC0415

    tokenizer = char_tokenizer()
    processor = vl_processor(Qwen3VLProcessor, tokenizer, QWEN3_VL_TOKENS, SHORT_CHAT)
    names = ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")
    rope = {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [2, 3, 3]}  # transformers 5
    legacy = dict(rope_scaling={"rope_type": "default", "mrope_section": [2, 3, 3]}, rope_theta=1e6)  # 4.x
    text = dict(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=32,
        num_hidden_layers=8,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=16,
        rope_parameters=rope,
        **legacy,
    )
    vision = dict(
        depth=1, hidden_size=16, intermediate_size=16, num_heads=2, out_hidden_size=32, deepstack_visual_indexes=[0]
    )
    ids = {name: tokenizer.convert_tokens_to_ids(token) for name, token in zip(names, QWEN3_VL_TOKENS)}
    config = Qwen3VLConfig(text_config=text, vision_config=vision, **ids)
    text_encoder = seeded(seed + 2, lambda: Qwen3VLForConditionalGeneration(config))
    transformer = seeded(
        seed,
        lambda: diffusers.NucleusMoEImageTransformer2DModel(
            patch_size=2,
            in_channels=16,
            out_channels=4,
            num_layers=3,
            attention_head_dim=16,
            num_attention_heads=4,
            num_key_value_heads=2,
            joint_attention_dim=32,
            axes_dims_rope=(4, 6, 6),
            dense_moe_strategy=dense_moe_strategy,
            num_experts=4,
            moe_intermediate_dim=32,
            capacity_factors=2.0,
        ),
    )
    generator = torch.Generator().manual_seed(seed + 3)
    for name, weight in transformer.named_parameters():
        if name.endswith(("experts.gate_up_proj", "experts.down_proj")):  # stock leaves them ``torch.empty``
            weight.data = torch.randn(weight.shape, generator=generator) * weight.shape[1] ** -0.5
    pipe = diffusers.NucleusMoEImagePipeline(
        transformer=transformer,
        vae=qwen_image(seed)[0].vae,
        scheduler=FlowMatchEulerDiscreteScheduler(),
        text_encoder=text_encoder,
        processor=processor,
    )
    return pipe, dict(PROMPTS, height=32, width=32, num_inference_steps=2, guidance_scale=4.0, max_sequence_length=48)


PIPELINES = {"flux": flux, "nucleusmoe-image": nucleusmoe_image, "qwen-image": qwen_image, "z-image": z_image}


def pipeline(name: str, seed: int = 0):
    if name not in PIPELINES:
        raise ValueError(f"No tiny image pipeline {name!r}; choose one of {sorted(PIPELINES)}.")
    return PIPELINES[name](seed)
