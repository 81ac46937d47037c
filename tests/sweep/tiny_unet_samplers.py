"""Tiny offline UNet pipelines that only the parity sweep builds: the unconditional ``UNet2DModel`` samplers (DDPM,
DDIM, PNDM, LDM, consistency models), Kandinsky 2.2's decoders (image embeddings instead of text, a MoVQ decoder)
and DeepFloyd IF (pixel space, T5, its super-resolution stages): each ``(pipe, call arguments)``, 2 layers per block,
4 heads."""

from __future__ import annotations

import diffusers
import torch
from diffusers.pipelines.kandinsky.text_encoder import MCLIPConfig, MultilingualCLIP

from diffusers_tpu.testing.tiny import char_tokenizer
from diffusers_tpu.testing.tiny_parts import (
    clip_image_processor,
    fit,
    seeded,
    test_image,
    test_mask,
    tiny_clip,
    tiny_clip_vision,
    tiny_prior,
    tiny_t5,
)

UNET_2D = dict(
    sample_size=16,
    in_channels=3,
    out_channels=3,
    layers_per_block=2,
    block_out_channels=(8, 16),
    norm_num_groups=4,
    attention_head_dim=4,
    down_block_types=("DownBlock2D", "AttnDownBlock2D"),
    up_block_types=("AttnUpBlock2D", "UpBlock2D"),
)


def unconditional(seed: int = 0, cls_name: str = "DDPMPipeline"):
    """A pixel-space (or, for LDM, VQ-latent) UNet without conditioning, two samples."""
    schedulers = {
        "DDPMPipeline": diffusers.DDPMScheduler,
        "DDIMPipeline": diffusers.DDIMScheduler,
        "PNDMPipeline": diffusers.PNDMScheduler,
        "LDMPipeline": diffusers.DDIMScheduler,
        "ConsistencyModelPipeline": diffusers.CMStochasticIterativeScheduler,
    }
    parts = dict(scheduler=schedulers[cls_name]())
    unet = dict(UNET_2D)
    if cls_name == "LDMPipeline":
        parts["vqvae"] = movq(seed + 1)
        unet.update(in_channels=4, out_channels=4, sample_size=8)
    parts["unet"] = seeded(seed, lambda: diffusers.UNet2DModel(**unet))
    call = dict(batch_size=2, num_inference_steps=5 if cls_name == "PNDMPipeline" else 2)  # PNDM: 4 warm-up steps
    if cls_name == "ConsistencyModelPipeline":
        call.update(class_labels=None)
    return fit(cls_name, parts, call)


def movq(seed):
    return seeded(
        seed,
        lambda: diffusers.VQModel(
            block_out_channels=(32, 32),
            down_block_types=("DownEncoderBlock2D", "AttnDownEncoderBlock2D"),
            up_block_types=("AttnUpDecoderBlock2D", "UpDecoderBlock2D"),
            in_channels=3,
            out_channels=3,
            latent_channels=4,
            norm_num_groups=32,
            num_vq_embeddings=16,
            vq_embed_dim=4,
            norm_type="spatial",
            layers_per_block=1,
        ),
    )
    # (MoVQ's spatial norm groups its channels by 32 whatever the config says)


def kandinsky22(seed: int = 0, cls_name: str = "KandinskyV22Pipeline"):
    """Kandinsky 2.2's decoder classes: the UNet attends to projected image embeddings (given, as the prior would
    give them), MoVQ decodes; img2img, inpaint and the depth-hint ControlNet variants."""
    inpaint, hint = "Inpaint" in cls_name, "Controlnet" in cls_name
    unet = seeded(
        seed,
        lambda: diffusers.UNet2DConditionModel(
            in_channels=9 if inpaint else 8 if hint else 4,
            out_channels=8,
            addition_embed_type="image_hint" if hint else "image",
            down_block_types=("ResnetDownsampleBlock2D", "SimpleCrossAttnDownBlock2D"),
            up_block_types=("SimpleCrossAttnUpBlock2D", "ResnetUpsampleBlock2D"),
            mid_block_type="UNetMidBlock2DSimpleCrossAttn",
            block_out_channels=(8, 16),
            layers_per_block=2,
            encoder_hid_dim=32,
            encoder_hid_dim_type="image_proj",
            cross_attention_dim=16,
            attention_head_dim=4,
            resnet_time_scale_shift="scale_shift",
            class_embed_type=None,
            norm_num_groups=4,
            sample_size=16,
        ),
    )
    parts = dict(
        unet=unet,
        movq=movq(seed + 1),
        scheduler=diffusers.DDPMScheduler(
            beta_schedule="linear",
            beta_start=0.00085,
            beta_end=0.012,
            clip_sample=False,
            steps_offset=1,
            prediction_type="epsilon",
            thresholding=False,
        ),
    )
    generator = torch.Generator().manual_seed(seed + 7)
    call = dict(
        image_embeds=torch.randn(2, 32, generator=generator),
        negative_image_embeds=torch.randn(2, 32, generator=generator),
        height=32,
        width=32,
        num_inference_steps=2,
        guidance_scale=4.0,
    )
    if hint:  # a depth map per image, at 8x the latents (the UNet's hint encoder downsamples it by 8)
        call["hint"] = torch.rand(2, 3, 128, 128, generator=generator)
    if inpaint:  # an image and a mask per prompt
        call.update(image=[test_image(), test_image(seed=seed + 1)], mask_image=[test_mask(), test_mask()])
    elif "Img2Img" in cls_name:
        call.update(image=test_image(), strength=0.8)
    return fit(cls_name, parts, call)


def deepfloyd_if(seed: int = 0, cls_name: str = "IFPipeline"):
    """DeepFloyd IF's stages: the 64-px base (here 16 px) and the super-resolution UNet that also takes the noisy
    low-resolution image and its noise level; text-to-image, img2img and inpainting of each."""
    sr = "SuperResolution" in cls_name
    unet = seeded(
        seed,
        lambda: diffusers.UNet2DConditionModel(
            sample_size=32 if sr else 16,
            in_channels=6 if sr else 3,
            out_channels=6,
            layers_per_block=2,
            block_out_channels=(8, 16),
            down_block_types=("ResnetDownsampleBlock2D", "SimpleCrossAttnDownBlock2D"),
            up_block_types=("SimpleCrossAttnUpBlock2D", "ResnetUpsampleBlock2D"),
            mid_block_type="UNetMidBlock2DSimpleCrossAttn",
            cross_attention_dim=32,
            encoder_hid_dim=32,
            attention_head_dim=4,
            addition_embed_type="text",
            addition_embed_type_num_heads=2,
            resnet_time_scale_shift="scale_shift",
            act_fn="gelu",
            norm_num_groups=4,
            class_embed_type="timestep" if sr else None,
        ),
    )
    scheduler = dict(
        num_train_timesteps=1000,
        beta_schedule="squaredcos_cap_v2",
        beta_start=0.0001,
        beta_end=0.02,
        thresholding=True,
        dynamic_thresholding_ratio=0.95,
        sample_max_value=1.0,
        prediction_type="epsilon",
        variance_type="learned_range",
    )
    parts = dict(
        tokenizer=char_tokenizer(),
        text_encoder=tiny_t5(seed + 2),
        unet=unet,
        scheduler=diffusers.DDPMScheduler(**scheduler),
        safety_checker=None,
        feature_extractor=None,
        watermarker=None,
        requires_safety_checker=False,
    )
    if sr:
        parts["image_noising_scheduler"] = diffusers.DDPMScheduler(**dict(scheduler, variance_type="fixed_small"))
    size = 32 if sr else 16
    call = dict(
        prompt=["a cat on the grass", "a red fox jumps over a sleeping dog in the snow"],
        negative_prompt=["blurry", "low quality, deformed"],
        num_inference_steps=2,
        guidance_scale=4.0,
        clean_caption=False,
        height=size,
        width=size,
    )
    low = [test_image(16, 16, seed + 3), test_image(16, 16, seed + 4)]
    if "Inpainting" in cls_name:
        call.update(
            image=[test_image(size, size), test_image(size, size, seed + 1)],
            mask_image=test_mask(size, size),
            strength=0.8,
        )
        if sr:
            call.update(original_image=call["image"], image=low)
    elif "Img2Img" in cls_name:
        call.update(image=[test_image(size, size), test_image(size, size, seed + 1)], strength=0.8)
        if sr:
            call.update(original_image=call["image"], image=low)
    elif sr:
        call.update(image=low)
    return fit(cls_name, parts, call)


def kandinsky3(seed: int = 0, cls_name: str = "Kandinsky3Pipeline"):
    """Kandinsky 3: its own UNet attending to T5 states, MoVQ decoding; text-to-image and img2img."""
    unet = seeded(
        seed,
        lambda: diffusers.Kandinsky3UNet(
            in_channels=4,
            time_embedding_dim=16,
            groups=2,
            attention_head_dim=4,
            layers_per_block=3,
            block_out_channels=(32, 64),
            cross_attention_dim=4,
            encoder_hid_dim=32,
        ),
    )
    parts = dict(
        tokenizer=char_tokenizer(),
        text_encoder=tiny_t5(seed + 2),
        unet=unet,
        movq=movq(seed + 1),
        scheduler=diffusers.DDPMScheduler(beta_schedule="squaredcos_cap_v2", clip_sample=True, thresholding=False),
    )
    call = dict(
        prompt=["a cat on the grass", "a red fox jumps over a sleeping dog in the snow"],
        negative_prompt=["blurry", "low quality, deformed"],
        height=32,
        width=32,
        num_inference_steps=2,
        guidance_scale=6.0,
    )
    if "Img2Img" in cls_name:
        call.update(image=[test_image(), test_image(seed=seed + 1)], strength=0.8)
    return fit(cls_name, parts, call)


def _kandinsky_prior(seed):
    """Kandinsky's prior parts (2.1 and 2.2): a ``PriorTransformer`` turning CLIP text states into a 32-wide image
    embedding, sampled by the unCLIP scheduler."""
    return dict(
        prior_prior=tiny_prior(seed + 3),
        prior_text_encoder=tiny_clip(seed + 4, projection=True),
        prior_image_encoder=tiny_clip_vision(seed + 5),
        prior_tokenizer=char_tokenizer(77),
        prior_image_processor=clip_image_processor(),
        prior_scheduler=diffusers.UnCLIPScheduler(
            variance_type="fixed_small_log", prediction_type="sample", clip_sample=True, clip_sample_range=10.0
        ),
    )


def _combined(seed, cls_name, decoder):
    """A Kandinsky combined class: the prior's parts in front of ``decoder``'s (``(pipe, call)`` of the decoder)."""
    pipe, call = decoder
    call = {k: v for k, v in call.items() if not k.endswith("image_embeds")}
    call.update(
        prompt=["a cat on the grass", "a red fox jumps over a sleeping dog in the snow"],
        negative_prompt=["blurry", "low quality, deformed"],
        prior_num_inference_steps=2,
        prior_guidance_scale=4.0,
    )
    return fit(cls_name, dict(pipe.components, **_kandinsky_prior(seed)), call)


def kandinsky22_combined(seed: int = 0, cls_name: str = "KandinskyV22CombinedPipeline"):
    """Kandinsky 2.2's combined classes: its prior in front of the decoder above."""
    return _combined(seed, cls_name, kandinsky22(seed, cls_name.replace("Combined", "")))


def kandinsky21(seed: int = 0, cls_name: str = "KandinskyPipeline"):
    """Kandinsky 2.1's decoders: the UNet attends to the multilingual CLIP text states beside the projected image
    embedding (given, as the prior would give them); text-to-image, img2img, inpaint and the combined classes."""
    if "Combined" in cls_name:
        return _combined(seed, cls_name, kandinsky21(seed, cls_name.replace("Combined", "")))
    inpaint = "Inpaint" in cls_name
    unet = seeded(
        seed,
        lambda: diffusers.UNet2DConditionModel(
            in_channels=9 if inpaint else 4,
            out_channels=8,
            addition_embed_type="text_image",
            down_block_types=("ResnetDownsampleBlock2D", "SimpleCrossAttnDownBlock2D"),
            up_block_types=("SimpleCrossAttnUpBlock2D", "ResnetUpsampleBlock2D"),
            mid_block_type="UNetMidBlock2DSimpleCrossAttn",
            block_out_channels=(8, 16),
            layers_per_block=2,
            encoder_hid_dim=32,
            encoder_hid_dim_type="text_image_proj",
            cross_attention_dim=32,
            attention_head_dim=4,
            resnet_time_scale_shift="scale_shift",
            class_embed_type=None,
            norm_num_groups=4,
            sample_size=16,
        ),
    )
    text_encoder = seeded(
        seed + 2,
        lambda: MultilingualCLIP(
            MCLIPConfig(
                numDims=32,
                transformerDimensions=32,
                hidden_size=32,
                intermediate_size=37,
                num_attention_heads=4,
                num_hidden_layers=2,
                vocab_size=128,
                pad_token_id=0,
                max_position_embeddings=80,
            )
        ),
    )
    parts = dict(
        unet=unet,
        movq=movq(seed + 1),
        text_encoder=text_encoder,
        tokenizer=char_tokenizer(77),
        scheduler=diffusers.DDIMScheduler(
            beta_schedule="linear",
            beta_start=0.00085,
            beta_end=0.012,
            clip_sample=False,
            set_alpha_to_one=False,
            steps_offset=1,
            prediction_type="epsilon",
            thresholding=False,
        ),
    )
    generator = torch.Generator().manual_seed(seed + 7)
    call = dict(
        prompt=["a cat on the grass", "a red fox jumps over a sleeping dog in the snow"],
        negative_prompt=["blurry", "low quality, deformed"],
        image_embeds=torch.randn(2, 32, generator=generator),
        negative_image_embeds=torch.randn(2, 32, generator=generator),
        height=32,
        width=32,
        num_inference_steps=2,
        guidance_scale=4.0,
    )
    if inpaint:
        call.update(image=[test_image(), test_image(seed=seed + 1)], mask_image=[test_mask(), test_mask()])
    elif "Img2Img" in cls_name:
        call.update(image=[test_image(), test_image(seed=seed + 1)], strength=0.8)
    return fit(cls_name, parts, call)
