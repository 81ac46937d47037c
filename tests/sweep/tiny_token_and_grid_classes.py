"""Tiny offline image pipelines of other kinds that only the parity sweep builds: aMUSEd (masked image tokens
predicted by a U-ViT, a VQ decoder) and VisualCloze (image-grid completion on Flux Fill): each ``(pipe, call
arguments)``, 2 layers, 2+ heads."""

from __future__ import annotations

import diffusers
from diffusers.pipelines.deprecated.vq_diffusion import LearnedClassifierFreeSamplingEmbeddings
from transformers import (
    CLIPTextConfig,
    CLIPTextModelWithProjection,
    GemmaConfig,
    GemmaModel,
    Qwen3Config,
    Qwen3ForCausalLM,
    Qwen3Model,
)

from diffusers_tpu.testing import tiny_images
from diffusers_tpu.testing.tiny import char_tokenizer
from diffusers_tpu.testing.tiny_parts import (
    PROMPTS,
    fit,
    kl_vae,
    rebuilt,
    seeded,
    test_image,
    test_mask,
    tiny_clip,
    tiny_t5,
)


def amused(seed: int = 0, cls_name: str = "AmusedPipeline"):
    """aMUSEd: the U-ViT predicts the masked VQ tokens of a 16x16 latent grid (32 px images), the scheduler unmasks
    the most confident ones each step (sampling from the logits with the generator); img2img and inpaint start
    from the image's tokens, inpaint re-masks the mask's."""
    transformer = seeded(
        seed,
        lambda: diffusers.UVit2DModel(
            hidden_size=16,
            use_bias=False,
            hidden_dropout=0.0,
            cond_embed_dim=16,
            micro_cond_encode_dim=2,
            micro_cond_embed_dim=10,
            encoder_hidden_size=16,
            vocab_size=32,
            codebook_size=16,
            in_channels=16,
            block_out_channels=16,
            num_res_blocks=1,
            downsample=True,
            upsample=True,
            block_num_heads=2,
            num_hidden_layers=2,
            num_attention_heads=2,
            attention_dropout=0.0,
            intermediate_size=16,
            layer_norm_eps=1e-06,
            ln_elementwise_affine=True,
        ),
    )
    vqvae = seeded(
        seed + 1,
        lambda: diffusers.VQModel(
            act_fn="silu",
            block_out_channels=[16],
            down_block_types=["DownEncoderBlock2D"],
            in_channels=3,
            latent_channels=16,
            layers_per_block=1,
            norm_num_groups=8,
            num_vq_embeddings=16,
            out_channels=3,
            sample_size=16,
            up_block_types=["UpDecoderBlock2D"],
            mid_block_add_attention=False,
            lookup_from_codebook=True,
        ),
    )
    text_encoder = seeded(
        seed + 2,
        lambda: CLIPTextModelWithProjection(
            CLIPTextConfig(
                hidden_size=16,
                intermediate_size=16,
                num_attention_heads=2,
                num_hidden_layers=2,
                projection_dim=16,
                max_position_embeddings=77,
                vocab_size=128,
                bos_token_id=None,
                eos_token_id=1,
                pad_token_id=0,
            )
        ),
    )
    parts = dict(
        transformer=transformer,
        vqvae=vqvae,
        text_encoder=text_encoder,
        tokenizer=char_tokenizer(77),
        scheduler=diffusers.AmusedScheduler(mask_token_id=31),
    )
    call = dict(PROMPTS, height=16, width=16, num_inference_steps=4, guidance_scale=4.0)
    if "Img2Img" in cls_name or "Inpaint" in cls_name:
        call.update(image=[test_image(16, 16), test_image(16, 16, seed + 1)], strength=0.8)  # one per prompt
    if "Inpaint" in cls_name:
        call.update(mask_image=[test_mask(16, 16)] * 2)
    return fit(cls_name, parts, call)


def visual_cloze(seed: int = 0, cls_name: str = "VisualClozePipeline"):
    """VisualCloze: Flux Fill's transformer (noise, the masked grid's latents and the mask side by side) completes
    the blank cell of an image grid (one in-context example row and the query row) from a task and a content
    prompt; the upsampling class then refines the cell (img2img)."""
    pipe, call = tiny_images.flux(seed)
    parts = dict(
        pipe.components, transformer=rebuilt(seed, pipe.transformer, in_channels=12, out_channels=4), resolution=16
    )
    grid = [[test_image(16, 16, seed + 1), test_image(16, 16, seed + 2)], [test_image(16, 16, seed + 3), None]]
    call = dict(
        task_prompt="each pair shows a photo and its edges",
        content_prompt="a red fox in the snow",
        image=grid,
        num_inference_steps=2,
        guidance_scale=5.0,
        max_sequence_length=48,
        upsampling_height=32,
        upsampling_width=32,
        upsampling_strength=0.4,
    )
    return fit(cls_name, parts, call)


def flux2_klein(seed: int = 0, cls_name: str = "Flux2KleinPipeline"):
    """FLUX.2 [klein]: a Qwen3 chat encoder (three layers' states side by side), the FLUX.2 transformer, FLUX.2's
    VAE (2x2-patchified latents under a batch norm); text-to-image with CFG, the distilled KV-cache class (a
    reference image's tokens cached once) and inpainting."""
    transformer = seeded(
        seed,
        lambda: diffusers.Flux2Transformer2DModel(
            patch_size=1,
            in_channels=16,
            num_layers=2,
            num_single_layers=2,
            attention_head_dim=16,
            num_attention_heads=4,
            joint_attention_dim=48,
            timestep_guidance_channels=32,
            axes_dims_rope=(4, 4, 4, 4),
            guidance_embeds="KV" in cls_name,
        ),
    )
    vae = seeded(
        seed + 1,
        lambda: diffusers.AutoencoderKLFlux2(
            block_out_channels=(8, 8),
            down_block_types=("DownEncoderBlock2D",) * 2,
            up_block_types=("UpDecoderBlock2D",) * 2,
            latent_channels=4,
            norm_num_groups=2,
            sample_size=32,
            layers_per_block=1,
        ),
    )
    text_encoder, tokenizer = _qwen3_chat(seed + 2, causal=True)
    parts = dict(
        transformer=transformer,
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        scheduler=diffusers.FlowMatchEulerDiscreteScheduler(),
        is_distilled="KV" in cls_name,
    )
    call = dict(
        prompt=PROMPTS["prompt"],
        height=32,
        width=32,
        num_inference_steps=2,
        guidance_scale=4.0,
        max_sequence_length=48,
        text_encoder_out_layers=(0, 1, 2),
    )
    if "KV" in cls_name:
        call.update(image=test_image(64, 64, seed + 3))  # stock takes references of 64 px or more
    if "Inpaint" in cls_name:
        call.update(image=[test_image(), test_image(seed=seed + 1)], mask_image=[test_mask()] * 2, strength=0.8)
    return fit(cls_name, parts, call)


def _qwen3_chat(seed, causal=False):
    """A 2-layer Qwen3 (its causal-LM class with ``causal``) and the character tokenizer with a chat template."""
    config = Qwen3Config(
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
    tokenizer = char_tokenizer()
    tokenizer.chat_template = "{% for m in messages %}<{{ m['content'] }}>{% endfor %}"
    return seeded(seed, lambda: (Qwen3ForCausalLM if causal else Qwen3Model)(config)), tokenizer


def ovis_image(seed: int = 0):
    """Ovis-Image: a Qwen3 encoder reading a system prompt and the user's (the system part dropped), a Flux-style
    double/single-stream transformer, CFG with a negative prompt."""
    transformer = seeded(
        seed,
        lambda: diffusers.OvisImageTransformer2DModel(
            patch_size=1,
            in_channels=16,
            out_channels=16,
            num_layers=2,
            num_single_layers=2,
            attention_head_dim=16,
            num_attention_heads=4,
            joint_attention_dim=16,
            axes_dims_rope=(4, 4, 8),
        ),
    )
    text_encoder, tokenizer = _qwen3_chat(seed + 2)
    pipe = diffusers.OvisImagePipeline(
        scheduler=diffusers.FlowMatchEulerDiscreteScheduler(),
        vae=kl_vae(seed + 1),
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        transformer=transformer,
    )
    # stock's system prompt, shortened for the character tokenizer: "<" + 10 characters dropped
    pipe.system_prompt, pipe.user_prompt_begin_id = "Describe: ", 11
    return pipe, dict(PROMPTS, guidance_scale=4.0, height=32, width=32, num_inference_steps=2, max_sequence_length=48)


BUILDERS = {
    amused: ("AmusedPipeline", "AmusedImg2ImgPipeline", "AmusedInpaintPipeline"),
    visual_cloze: ("VisualClozePipeline", "VisualClozeGenerationPipeline"),
    flux2_klein: ("Flux2KleinPipeline", "Flux2KleinKVPipeline", "Flux2KleinInpaintPipeline"),
}
RECIPES = {"OvisImagePipeline": ovis_image}


def bria(seed: int = 0):
    """Bria 3.2: T5 states into a Flux-style transformer (no pooled text), CFG with a negative prompt."""
    transformer = seeded(
        seed,
        lambda: diffusers.BriaTransformer2DModel(
            patch_size=1,
            in_channels=16,
            num_layers=2,
            num_single_layers=2,
            attention_head_dim=16,
            num_attention_heads=4,
            joint_attention_dim=32,
            axes_dims_rope=[4, 4, 8],
        ),
    )
    pipe = diffusers.BriaPipeline(
        transformer=transformer,
        scheduler=diffusers.FlowMatchEulerDiscreteScheduler(),
        vae=kl_vae(seed + 1),
        text_encoder=tiny_t5(seed + 2),
        tokenizer=char_tokenizer(),
    )
    return pipe, dict(PROMPTS, guidance_scale=4.0, height=32, width=32, num_inference_steps=2, max_sequence_length=48)


def lumina(seed: int = 0):
    """Lumina-Next: a Gemma encoder, the next-DiT (grouped KV heads, its own RoPE scaling), CFG."""
    transformer = seeded(
        seed,
        lambda: diffusers.LuminaNextDiT2DModel(
            sample_size=16,
            patch_size=2,
            in_channels=4,
            hidden_size=32,
            num_layers=2,
            num_attention_heads=4,
            num_kv_heads=2,
            multiple_of=16,
            ffn_dim_multiplier=None,
            norm_eps=1e-5,
            learn_sigma=True,
            qk_norm=True,
            cross_attention_dim=16,
            scaling_factor=1.0,
        ),
    )
    text_encoder = seeded(
        seed + 2,
        lambda: GemmaModel(
            GemmaConfig(
                hidden_size=16,
                intermediate_size=16,
                num_hidden_layers=2,
                num_attention_heads=2,
                num_key_value_heads=2,
                head_dim=8,
                vocab_size=128,
                max_position_embeddings=512,
                pad_token_id=0,
                eos_token_id=1,
            )
        ),
    )
    pipe = diffusers.LuminaPipeline(
        transformer=transformer,
        scheduler=diffusers.FlowMatchEulerDiscreteScheduler(),
        vae=kl_vae(seed + 1),
        text_encoder=text_encoder,
        tokenizer=char_tokenizer(),
    )
    # stock sizes latents by 8 whatever the VAE: 128 px -> 16x16 latents, a 32 px image from the 2x tiny VAE
    return pipe, dict(
        PROMPTS,
        guidance_scale=4.0,
        height=128,
        width=128,
        num_inference_steps=2,
        max_sequence_length=48,
        clean_caption=False,
    )


def vq_diffusion(seed: int = 0):
    """VQ-Diffusion: a discrete transformer predicts the log-probabilities of a 4x4 grid of VQ codes (a mask class
    beside them), the scheduler samples the codes (Gumbel noise from the generator), learned-free CFG."""
    codes = 12
    vqvae = seeded(
        seed + 1,
        lambda: diffusers.VQModel(
            block_out_channels=[16, 32],
            in_channels=3,
            out_channels=3,
            down_block_types=["DownEncoderBlock2D"] * 2,
            up_block_types=["UpDecoderBlock2D"] * 2,
            latent_channels=3,
            num_vq_embeddings=codes,
            vq_embed_dim=3,
            norm_num_groups=8,
            layers_per_block=1,
        ),
    )
    transformer = seeded(
        seed,
        lambda: diffusers.Transformer2DModel(
            attention_bias=True,
            cross_attention_dim=32,
            attention_head_dim=8,
            num_attention_heads=2,
            num_layers=2,
            num_vector_embeds=codes + 1,
            num_embeds_ada_norm=16,
            norm_num_groups=8,
            sample_size=4,
            activation_fn="geglu-approximate",
        ),
    )
    parts = dict(
        vqvae=vqvae,
        transformer=transformer,
        text_encoder=tiny_clip(seed + 2),
        tokenizer=char_tokenizer(77),
        scheduler=diffusers.VQDiffusionScheduler(num_vec_classes=codes + 1, num_train_timesteps=16),
        learned_classifier_free_sampling_embeddings=LearnedClassifierFreeSamplingEmbeddings(learnable=False),
    )
    call = dict(prompt=PROMPTS["prompt"], num_inference_steps=2, guidance_scale=4.0, truncation_rate=0.9)
    return fit("VQDiffusionPipeline", parts, call)


RECIPES.update(BriaPipeline=bria, LuminaPipeline=lumina, VQDiffusionPipeline=vq_diffusion)
