"""Tiny offline relatives of SD 1.5 that only the parity sweep builds, each on a model SD 1.5 does not have: an
exemplar image encoder (Paint-by-Example), the ControlNet-XS adapter fused into the UNet, GLIGEN's gated grounding
layers, the latent x2 upscaler's K-UNet, unCLIP's prior and image-embedding noise, a depth estimator (depth2img),
LDM's BERT and VQ models, RePaint's resampling scheduler and AltDiffusion's Roberta encoder: each
``(pipe, call arguments)``, 2 layers per block."""

from __future__ import annotations

import diffusers
import torch
import transformers
from diffusers.pipelines.deprecated.alt_diffusion.modeling_roberta_series import (
    RobertaSeriesConfig,
    RobertaSeriesModelWithTransformation,
)
from diffusers.pipelines.deprecated.paint_by_example import PaintByExampleImageEncoder
from diffusers.pipelines.latent_diffusion.pipeline_latent_diffusion import LDMBertConfig, LDMBertModel
from diffusers.pipelines.stable_diffusion import CLIPImageProjection
from diffusers.pipelines.stable_diffusion.stable_unclip_image_normalizer import StableUnCLIPImageNormalizer
from transformers import CLIPProcessor, CLIPVisionConfig, DPTConfig, DPTForDepthEstimation

from diffusers_tpu.testing import tiny_unet
from diffusers_tpu.testing.tiny import char_tokenizer
from diffusers_tpu.testing.tiny_parts import (
    PROMPTS,
    clip_image_processor,
    fit,
    rebuilt,
    seeded,
    test_image,
    test_mask,
    tiny_clip,
    tiny_clip_vision,
    tiny_prior,
)

from .tiny_unet_samplers import UNET_2D, movq

PROMPT_PAIR = dict(
    prompt=["a cat on the grass", "a red fox jumps over a sleeping dog in the snow"],
    negative_prompt=["blurry", "low quality, deformed"],
)
CLIP_LAYERS = dict(hidden_size=32, intermediate_size=37, num_attention_heads=4, num_hidden_layers=2, projection_dim=32)


def _sd(seed, **unet):
    return tiny_unet._sd_parts(seed, unet or None)


def paint_by_example(seed: int = 0):
    """Inpainting guided by an example image: a CLIP vision encoder with a mapper replaces the text encoder."""
    parts = _sd(seed, in_channels=9)
    parts.update(
        image_encoder=seeded(
            seed + 3,
            lambda: PaintByExampleImageEncoder(
                CLIPVisionConfig(**dict(CLIP_LAYERS, image_size=32, patch_size=8)), proj_size=32
            ),
        ),
        feature_extractor=clip_image_processor(),
    )
    call = dict(
        example_image=[test_image(seed=seed + 5), test_image(seed=seed + 6)],
        image=[test_image(), test_image(seed=seed + 1)],
        mask_image=test_mask(),
        height=32,
        width=32,
        num_inference_steps=2,
        guidance_scale=4.0,
    )
    return fit("PaintByExamplePipeline", parts, call)


def controlnet_xs(seed: int = 0, cls_name: str = "StableDiffusionControlNetXSPipeline"):
    """ControlNet-XS: a small adapter built from the UNet and fused with it block by block (SD 1.5 and SDXL)."""
    xl = "XL" in cls_name
    if xl:
        pipe, call = tiny_unet.sdxl(seed)
        parts = dict(pipe.components)
    else:
        parts, call = _sd(seed), dict(PROMPTS, height=32, width=32, num_inference_steps=2)
    parts["unet"] = rebuilt(seed, parts["unet"], attention_head_dim=4, norm_num_groups=4)
    parts["controlnet"] = seeded(
        seed + 5,
        lambda: diffusers.ControlNetXSAdapter.from_unet(
            parts["unet"], size_ratio=1.0, learn_time_embedding=True, conditioning_embedding_out_channels=(4, 8)
        ),
    )
    call.update(image=test_image(seed=seed + 5), controlnet_conditioning_scale=0.7)
    return fit(cls_name, parts, call)


def gligen(seed: int = 0, cls_name: str = "StableDiffusionGLIGENPipeline"):
    """GLIGEN: gated self-attention layers that attend to grounding tokens (a phrase's text embedding, or an image
    embedding, with its box), on during the first part of the schedule."""
    text_image = "TextImage" in cls_name
    parts = _sd(seed, attention_type="gated-text-image" if text_image else "gated")
    call = dict(
        prompt=PROMPTS["prompt"][1],
        negative_prompt=PROMPTS["negative_prompt"][0],
        height=32,
        width=32,
        num_inference_steps=2,
        gligen_phrases=["a cat", "grass"],
        gligen_scheduled_sampling_beta=1.0,
        gligen_boxes=[[0.1, 0.1, 0.5, 0.6], [0.4, 0.5, 0.9, 0.9]],
    )  # one prompt: its phrases are batched
    if text_image:
        parts.update(
            image_encoder=tiny_clip_vision(seed + 3),
            image_project=seeded(seed + 4, lambda: CLIPImageProjection(hidden_size=32)),
            processor=CLIPProcessor(image_processor=clip_image_processor(), tokenizer=parts["tokenizer"]),
        )
        call.update(
            gligen_images=[test_image(seed=seed + 5), None],
            gligen_phrases=[None, "grass"],
            gligen_boxes=[[0.1, 0.1, 0.5, 0.6], [0.4, 0.5, 0.9, 0.9]],
        )
    return fit(cls_name, parts, call)


def latent_upscale(seed: int = 0):
    """The latent x2 upscaler: a K-diffusion UNet (Fourier time embedding, noise level and pooled text as its time
    condition) denoising at twice the image's latent size from its latents."""
    parts = _sd(seed)
    parts["unet"] = seeded(
        seed,
        lambda: diffusers.UNet2DConditionModel(
            act_fn="gelu",
            attention_head_dim=8,
            norm_num_groups=None,
            block_out_channels=(32, 32, 64, 64),  # groups of 32
            time_cond_proj_dim=160,
            conv_in_kernel=1,
            conv_out_kernel=1,
            cross_attention_dim=32,
            down_block_types=("KDownBlock2D",) + ("KCrossAttnDownBlock2D",) * 3,
            in_channels=8,
            mid_block_type=None,
            only_cross_attention=False,
            out_channels=5,
            resnet_time_scale_shift="scale_shift",
            time_embedding_type="fourier",
            timestep_post_act="gelu",
            up_block_types=("KCrossAttnUpBlock2D",) * 3 + ("KUpBlock2D",),
            layers_per_block=2,
        ),
    )
    parts["scheduler"] = diffusers.EulerDiscreteScheduler(prediction_type="sample")
    call = dict(
        PROMPTS, image=[test_image(16, 16), test_image(16, 16, seed + 1)], num_inference_steps=2, guidance_scale=4.0
    )
    return fit("StableDiffusionLatentUpscalePipeline", parts, call)


def stable_unclip(seed: int = 0, cls_name: str = "StableUnCLIPPipeline"):
    """Stable unCLIP: the UNet conditioned on a (noised, normalized) CLIP image embedding through its class
    embedding — from a prior on the text (text-to-image) or from the image itself (image variation)."""
    parts = _sd(seed, class_embed_type="projection", projection_class_embeddings_input_dim=64)

    parts.update(
        image_normalizer=StableUnCLIPImageNormalizer(embedding_dim=32),
        image_noising_scheduler=diffusers.DDPMScheduler(beta_schedule="squaredcos_cap_v2"),
    )
    call = dict(PROMPTS, height=32, width=32, num_inference_steps=2, noise_level=20, guidance_scale=4.0)
    if "Img2Img" in cls_name:
        parts.update(image_encoder=tiny_clip_vision(seed + 3), feature_extractor=clip_image_processor())
        call.update(image=test_image(seed=seed + 5))
    else:
        parts.update(
            prior_tokenizer=char_tokenizer(77),
            prior_text_encoder=tiny_clip(seed + 4, projection=True),
            prior=tiny_prior(seed + 3),
            prior_scheduler=diffusers.DDPMScheduler(
                beta_schedule="squaredcos_cap_v2",
                prediction_type="sample",
                num_train_timesteps=1000,
                clip_sample=True,
                clip_sample_range=5.0,
            ),
        )
        call.update(prior_num_inference_steps=2, prior_guidance_scale=4.0)
    return fit(cls_name, parts, call)


def depth2img(seed: int = 0):
    """Depth-to-image: a DPT depth estimator reads the image; its depth map, at the latents' size, joins the
    latents as a fifth UNet input channel."""
    parts = _sd(seed, in_channels=5)
    parts["depth_estimator"] = seeded(
        seed + 3,
        lambda: DPTForDepthEstimation(
            DPTConfig(
                image_size=32,
                patch_size=8,
                hidden_size=32,
                num_hidden_layers=4,
                num_attention_heads=4,
                intermediate_size=37,
                backbone_out_indices=(0, 1, 2, 3),
                is_hybrid=False,
                reassemble_factors=[4, 2, 1, 0.5],
                neck_hidden_sizes=[8, 8, 16, 16],
                fusion_hidden_size=16,
                head_hidden_size=8,
            )
        ),
    )
    processor = getattr(transformers, "DPTImageProcessorPil", transformers.DPTImageProcessor)
    parts["feature_extractor"] = processor(size={"height": 32, "width": 32}, keep_aspect_ratio=False)
    call = dict(
        PROMPTS,
        image=[test_image(), test_image(seed=seed + 1)],
        num_inference_steps=3,
        strength=0.8,
        guidance_scale=4.0,
    )
    return fit("StableDiffusionDepth2ImgPipeline", parts, call)


def alt_diffusion(seed: int = 0, cls_name: str = "AltDiffusionPipeline"):
    """AltDiffusion: SD 1.5 with a multilingual XLM-Roberta text encoder and a projection."""
    parts = _sd(seed)
    parts["text_encoder"] = seeded(
        seed + 2,
        lambda: RobertaSeriesModelWithTransformation(
            RobertaSeriesConfig(
                hidden_size=32,
                project_dim=32,
                intermediate_size=37,
                layer_norm_eps=1e-05,
                num_attention_heads=4,
                num_hidden_layers=2,
                pad_token_id=0,
                bos_token_id=None,
                eos_token_id=1,
                vocab_size=128,
                max_position_embeddings=80,
            )
        ),
    )
    call = dict(PROMPTS, height=32, width=32, num_inference_steps=2)
    if "Img2Img" in cls_name:
        call.update(image=test_image(), strength=0.8)
    return fit(cls_name, parts, call)


def ldm_text_to_image(seed: int = 0):
    """LDM text-to-image: LDM's own BERT encoder, a VQ autoencoder."""

    parts = dict(
        vqvae=movq(seed + 1),
        tokenizer=char_tokenizer(77),
        bert=seeded(
            seed + 2,
            lambda: LDMBertModel(
                LDMBertConfig(
                    d_model=32,
                    encoder_ffn_dim=37,
                    encoder_layers=2,
                    encoder_attention_heads=4,
                    head_dim=8,
                    vocab_size=128,
                    max_position_embeddings=77,
                    pad_token_id=0,
                )
            ),
        ),
        unet=_sd(seed)["unet"],
        scheduler=diffusers.DDIMScheduler(
            beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", clip_sample=False, set_alpha_to_one=False
        ),
    )
    call = dict(prompt=PROMPT_PAIR["prompt"], height=64, width=64, num_inference_steps=2, guidance_scale=4.0)
    return fit("LDMTextToImagePipeline", parts, call)


def ldm_super_resolution(seed: int = 0):
    """LDM x4 super-resolution: a UNet2DModel reading the low-resolution image beside VQ latents."""
    unet = seeded(seed, lambda: diffusers.UNet2DModel(**dict(UNET_2D, in_channels=6, out_channels=3, sample_size=16)))
    vqvae = seeded(
        seed + 1,
        lambda: diffusers.VQModel(  # 3 latent channels, the image's size
            block_out_channels=(8, 16),
            down_block_types=("DownEncoderBlock2D",) * 2,
            up_block_types=("UpDecoderBlock2D",) * 2,
            latent_channels=3,
            num_vq_embeddings=16,
            vq_embed_dim=3,
            norm_num_groups=4,
            layers_per_block=1,
        ),
    )
    parts = dict(vqvae=vqvae, unet=unet, scheduler=diffusers.DDIMScheduler())
    images = torch.rand(2, 3, 16, 16, generator=torch.Generator().manual_seed(seed + 5)) * 2 - 1  # a batch: a tensor
    call = dict(image=images, num_inference_steps=2, eta=0.0)
    return fit("LDMSuperResolutionPipeline", parts, call)


def repaint(seed: int = 0):
    """RePaint: unconditional pixel inpainting that jumps back in the schedule to resample (jump length 2)."""
    unet = seeded(seed, lambda: diffusers.UNet2DModel(**dict(UNET_2D, sample_size=32)))
    parts = dict(unet=unet, scheduler=diffusers.RePaintScheduler())
    call = dict(
        image=[test_image(), test_image(seed=seed + 1)],
        mask_image=test_mask(),
        num_inference_steps=4,
        jump_length=2,
        jump_n_sample=2,
        eta=0.0,
    )
    return fit("RePaintPipeline", parts, call)


BUILDERS = {
    paint_by_example: ("PaintByExamplePipeline",),
    controlnet_xs: ("StableDiffusionControlNetXSPipeline", "StableDiffusionXLControlNetXSPipeline"),
    gligen: ("StableDiffusionGLIGENPipeline", "StableDiffusionGLIGENTextImagePipeline"),
    latent_upscale: ("StableDiffusionLatentUpscalePipeline",),
    stable_unclip: ("StableUnCLIPPipeline", "StableUnCLIPImg2ImgPipeline"),
    depth2img: ("StableDiffusionDepth2ImgPipeline",),
    alt_diffusion: ("AltDiffusionPipeline", "AltDiffusionImg2ImgPipeline"),
    ldm_text_to_image: ("LDMTextToImagePipeline",),
    ldm_super_resolution: ("LDMSuperResolutionPipeline",),
    repaint: ("RePaintPipeline",),
}
