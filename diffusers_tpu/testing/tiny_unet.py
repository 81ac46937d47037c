"""Tiny offline UNet pipelines: Stable Diffusion 1.5 (text-to-image, img2img, inpaint, ControlNet), SDXL, Stable Video
Diffusion and AnimateDiff. Every UNet has 2 layers per block and 4+ heads; prompts of different lengths.
``(pipe, call arguments)`` like ``tiny_images``."""

from __future__ import annotations

import numpy as np
import torch
from diffusers import (
    AnimateDiffPipeline,
    AutoencoderKL,
    AutoencoderKLTemporalDecoder,
    ControlNetModel,
    DDIMScheduler,
    EulerDiscreteScheduler,
    MotionAdapter,
    StableDiffusionControlNetPipeline,
    StableDiffusionImg2ImgPipeline,
    StableDiffusionInpaintPipeline,
    StableDiffusionPipeline,
    StableDiffusionXLPipeline,
    StableVideoDiffusionPipeline,
    UNet2DConditionModel,
    UNetSpatioTemporalConditionModel,
)
from diffusers.pipelines.stable_diffusion.safety_checker import StableDiffusionSafetyChecker
from PIL import Image
from transformers import CLIPConfig, CLIPImageProcessor, CLIPVisionConfig, CLIPVisionModelWithProjection

from .tiny import char_tokenizer
from .tiny_parts import tiny_clip

PROMPTS = dict(
    prompt=["a cat on the grass", "a red fox jumps over a sleeping dog in the snow"],
    negative_prompt=["blurry", "low quality, deformed"],
)
# SD 1.5's layout at 1/40 of its width: cross-attention in the first block, 4 heads (tp=4 divides them)
SD_UNET = dict(
    block_out_channels=(8, 16),
    layers_per_block=2,
    sample_size=16,
    in_channels=4,
    out_channels=4,
    down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
    up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
    cross_attention_dim=32,
    norm_num_groups=4,
    attention_head_dim=4,
)
SD_VAE = dict(
    block_out_channels=(8, 8),
    down_block_types=("DownEncoderBlock2D",) * 2,
    up_block_types=("UpDecoderBlock2D",) * 2,
    norm_num_groups=2,
    latent_channels=4,
)


def _image(height: int, width: int, seed: int = 0, frames: int | None = None):
    """A deterministic RGB PIL image (a list of them with ``frames``)."""
    pixels = np.random.default_rng(seed).integers(0, 256, size=(frames or 1, height, width, 3), dtype=np.uint8)
    images = [Image.fromarray(p) for p in pixels]
    return images if frames else images[0]


def _sd_parts(seed: int, unet_overrides: dict | None = None) -> dict:
    torch.manual_seed(seed)
    unet = UNet2DConditionModel(**dict(SD_UNET, **(unet_overrides or {}))).eval()
    torch.manual_seed(seed + 1)
    vae = AutoencoderKL(**SD_VAE).eval()
    return dict(
        unet=unet,
        vae=vae,
        text_encoder=tiny_clip(seed + 2),
        tokenizer=char_tokenizer(77),
        scheduler=DDIMScheduler(
            beta_start=0.00085,
            beta_end=0.012,
            beta_schedule="scaled_linear",
            clip_sample=False,
            set_alpha_to_one=False,
            steps_offset=1,
        ),
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )


def _safety_checker(seed: int):
    """SD 1.5's safety checker (a CLIP vision model scoring the images; it reads its scores with numpy, so on JAX
    it runs eagerly) and its feature extractor."""
    torch.manual_seed(seed)
    layers = dict(hidden_size=32, intermediate_size=37, num_attention_heads=4, num_hidden_layers=2, projection_dim=32)
    config = CLIPConfig(text_config=layers, vision_config=dict(layers, image_size=32, patch_size=8), projection_dim=32)
    return StableDiffusionSafetyChecker(config).eval(), CLIPImageProcessor(crop_size=32, size=32)


def sd(seed: int = 0):
    """SD 1.5 as its checkpoints ship: with the safety checker."""
    checker, extractor = _safety_checker(seed + 4)
    parts = dict(_sd_parts(seed), safety_checker=checker, feature_extractor=extractor, requires_safety_checker=True)
    return StableDiffusionPipeline(**parts), dict(PROMPTS, height=32, width=32, num_inference_steps=2)


def sd_img2img(seed: int = 0):
    return StableDiffusionImg2ImgPipeline(**_sd_parts(seed)), dict(
        PROMPTS, image=_image(32, 32, seed), strength=0.75, num_inference_steps=4
    )


def sd_inpaint(seed: int = 0):
    mask = np.zeros((32, 32), np.uint8)
    mask[8:24, 4:20] = 255

    parts = _sd_parts(seed, dict(in_channels=9))  # noise 4 + masked image latents 4 + mask 1
    return StableDiffusionInpaintPipeline(**parts), dict(
        PROMPTS,
        image=_image(32, 32, seed),
        mask_image=Image.fromarray(mask),
        height=32,
        width=32,
        num_inference_steps=2,
    )


def controlnet(seed: int, cls=None, **extra):
    """SD 1.5's tiny ControlNet (``cls``: another ControlNet class of the same layout, e.g. SparseCtrl's)."""
    config = dict(
        dict(
            block_out_channels=(8, 16),
            layers_per_block=2,
            in_channels=4,
            down_block_types=SD_UNET["down_block_types"],
            cross_attention_dim=32,
            norm_num_groups=4,
            attention_head_dim=4,
            conditioning_embedding_out_channels=(8, 8),
        ),
        **extra,
    )
    torch.manual_seed(seed)
    return (cls or ControlNetModel)(**config).eval()


def sd_controlnet(seed: int = 0):
    parts = _sd_parts(seed)
    return StableDiffusionControlNetPipeline(**parts, controlnet=controlnet(seed + 3), image_encoder=None), dict(
        PROMPTS, image=_image(32, 32, seed), height=32, width=32, num_inference_steps=2
    )


def sdxl(seed: int = 0):
    """SDXL's layout: two CLIP text encoders (the second with a projection, concatenated to 64 features), time ids
    as added conditions, a linear-projection transformer of 2 layers in the second block."""
    torch.manual_seed(seed)
    unet = UNet2DConditionModel(
        block_out_channels=(8, 16),
        layers_per_block=2,
        sample_size=16,
        in_channels=4,
        out_channels=4,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        attention_head_dim=(2, 4),
        use_linear_projection=True,
        addition_embed_type="text_time",
        addition_time_embed_dim=8,
        transformer_layers_per_block=(1, 2),
        projection_class_embeddings_input_dim=80,
        cross_attention_dim=64,
        norm_num_groups=4,
    ).eval()
    torch.manual_seed(seed + 1)
    vae = AutoencoderKL(**SD_VAE, sample_size=32).eval()
    text_encoder_2 = tiny_clip(seed + 3, projection=True)
    pipe = StableDiffusionXLPipeline(
        vae=vae,
        text_encoder=tiny_clip(seed + 2),
        text_encoder_2=text_encoder_2,
        tokenizer=char_tokenizer(77),
        tokenizer_2=char_tokenizer(77),
        unet=unet,
        scheduler=EulerDiscreteScheduler(),
        image_encoder=None,
        feature_extractor=None,
        force_zeros_for_empty_prompt=False,
    )
    return pipe, dict(PROMPTS, height=32, width=32, num_inference_steps=2)


def svd(seed: int = 0):
    """Stable Video Diffusion: image-to-video, a spatio-temporal UNet (32 groups: channels 32/64), CLIP image
    embeddings, the temporal VAE decoder; CFG between 1.0 and 3.0 over the frames."""
    torch.manual_seed(seed)
    unet = UNetSpatioTemporalConditionModel(
        block_out_channels=(32, 64),
        layers_per_block=2,
        sample_size=8,
        in_channels=8,
        out_channels=4,
        down_block_types=("CrossAttnDownBlockSpatioTemporal", "DownBlockSpatioTemporal"),
        up_block_types=("UpBlockSpatioTemporal", "CrossAttnUpBlockSpatioTemporal"),
        cross_attention_dim=32,
        num_attention_heads=(4, 4),
        projection_class_embeddings_input_dim=96,
        addition_time_embed_dim=32,
        num_frames=3,
    ).eval()
    torch.manual_seed(seed + 1)
    vae = AutoencoderKLTemporalDecoder(
        block_out_channels=[32, 64],
        in_channels=3,
        out_channels=3,
        down_block_types=["DownEncoderBlock2D"] * 2,
        latent_channels=4,
    ).eval()
    torch.manual_seed(seed + 2)
    image_encoder = CLIPVisionModelWithProjection(
        CLIPVisionConfig(
            hidden_size=32,
            projection_dim=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            image_size=224,
            intermediate_size=37,
            patch_size=56,
        )
    ).eval()  # SVD resizes the image to 224 for CLIP
    # SVD's scheduler but for sigma_max (700 there; here the betas' own, 14.6): at 700 the first Euler step adds
    # two latents of magnitude ~2600 that cancel to ~2, so float32 keeps 2.4e-4 (one ulp at 2600) of the result,
    # and any backend's last-bit difference in the UNet (here 5.7e-6) moves ~0.2% of the 8-bit pixels by a level.
    scheduler = EulerDiscreteScheduler(
        beta_schedule="scaled_linear",
        beta_start=0.00085,
        beta_end=0.012,
        interpolation_type="linear",
        prediction_type="v_prediction",
        sigma_min=0.002,
        steps_offset=1,
        timestep_spacing="leading",
        timestep_type="continuous",
        use_karras_sigmas=True,
    )
    pipe = StableVideoDiffusionPipeline(
        vae=vae,
        image_encoder=image_encoder,
        unet=unet,
        scheduler=scheduler,
        feature_extractor=CLIPImageProcessor(crop_size=32, size=32),
    )
    return pipe, dict(
        image=_image(32, 32, seed),
        height=32,
        width=32,
        num_frames=3,
        decode_chunk_size=2,
        num_inference_steps=2,
        min_guidance_scale=1.0,
        max_guidance_scale=3.0,
    )


def animatediff(seed: int = 0):
    """AnimateDiff: SD 1.5's UNet with motion modules (temporal attention over the frames, 4 heads)."""
    parts = _sd_parts(seed)
    for key in ("safety_checker", "requires_safety_checker"):
        parts.pop(key)
    torch.manual_seed(seed + 3)
    adapter = MotionAdapter(
        block_out_channels=(8, 16), motion_layers_per_block=2, motion_norm_num_groups=2, motion_num_attention_heads=4
    )
    pipe = AnimateDiffPipeline(motion_adapter=adapter, image_encoder=None, **parts)
    pipe.unet.eval()
    return pipe, dict(PROMPTS, height=32, width=32, num_frames=4, num_inference_steps=2)


PIPELINES = {
    "sd": sd,
    "sd-img2img": sd_img2img,
    "sd-inpaint": sd_inpaint,
    "sd-controlnet": sd_controlnet,
    "sdxl": sdxl,
    "svd": svd,
    "animatediff": animatediff,
}


def pipeline(name: str, seed: int = 0):
    if name not in PIPELINES:
        raise ValueError(f"No tiny UNet pipeline {name!r}; choose one of {sorted(PIPELINES)}.")
    return PIPELINES[name](seed)
