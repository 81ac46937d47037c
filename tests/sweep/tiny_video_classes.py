"""Tiny offline video pipelines that only the parity sweep builds (AnimateDiff's ControlNet / SparseCtrl / SDXL
variants, PIA, I2VGenXL, Text2Video-Zero, EasyAnimate inpaint / control, Helios pyramid, ...): each ``(pipe, call
arguments)``, 2+ layers, heads that tp=2 divides, prompts of different lengths where the class takes several.

Over 400 lines: one small builder per pipeline class, written out as ``ruff format`` lays them."""

from __future__ import annotations

import diffusers
import torch
import transformers
from diffusers import (
    AutoencoderKLCosmos,
    AutoencoderKLWan,
    ClassifierFreeGuidance,
    CosmosTransformer3DModel,
    DDIMScheduler,
    EDMEulerScheduler,
    FlowMatchEulerDiscreteScheduler,
    HeliosPyramidPipeline,
    HeliosScheduler,
    HunyuanVideoFramepackPipeline,
    HunyuanVideoFramepackTransformer3DModel,
    I2VGenXLPipeline,
    I2VGenXLUNet,
    LTXI2VLongMultiPromptPipeline,
    MotifVideoTransformer3DModel,
    MotionAdapter,
    PIAPipeline,
    SanaImageToVideoPipeline,
    TextToVideoZeroPipeline,
    TextToVideoZeroSDXLPipeline,
    UNet2DConditionModel,
)
from diffusers.pipelines.ltx2.pipeline_ltx2_ic_lora import LTX2ReferenceCondition
from transformers import (
    CLIPVisionConfig,
    CLIPVisionModelWithProjection,
    SiglipImageProcessor,
    SiglipVisionConfig,
    SiglipVisionModel,
)
from transformers.models.t5gemma2 import T5Gemma2Encoder, T5Gemma2EncoderConfig

from diffusers_tpu.testing import tiny_unet
from diffusers_tpu.testing.tiny import CLIP_VISION, WAN_VAE, char_tokenizer
from diffusers_tpu.testing.tiny_families import pipeline, test_frames
from diffusers_tpu.testing.tiny_generic import easyanimate_pipeline
from diffusers_tpu.testing.tiny_hunyuan import hunyuan_video
from diffusers_tpu.testing.tiny_parts import (
    PassThroughGuardrail,
    fit,
    kl_vae,
    rebuilt,
    seeded,
    test_image,
    tiny_clip,
    tiny_t5,
)

ONE_PROMPT = dict(prompt="a cat walks on the grass", negative_prompt="blurry, low quality")


def _animatediff_parts(seed):
    pipe, call = tiny_unet.animatediff(seed)
    return dict(pipe.components), call


def animatediff_controlnet(seed: int = 0, cls_name: str = "AnimateDiffControlNetPipeline"):
    """AnimateDiff with a ControlNet over every frame (text-to-video, and video-to-video)."""
    components, call = _animatediff_parts(seed)
    components.pop("unet")  # the pipeline builds its motion UNet from the 2-D one again
    pipe = getattr(diffusers, cls_name)(
        unet=tiny_unet.animatediff(seed)[0].unet,
        controlnet=tiny_unet.controlnet(seed + 5),
        **{k: v for k, v in components.items() if k != "controlnet"},
    )
    # one video, one prompt: the control frames are the video's
    call = dict(call, **ONE_PROMPT, conditioning_frames=test_frames(4, seed=seed + 7))
    if "VideoToVideo" in cls_name:  # its length is the video's
        call = dict(call, video=test_frames(4), strength=0.8)
        call.pop("num_frames")
    return pipe, call


def animatediff_sparse(seed: int = 0):
    """AnimateDiff SparseCtrl: a sparse ControlNet conditioned on two of the four frames."""
    components, call = _animatediff_parts(seed)
    controlnet = tiny_unet.controlnet(
        seed + 5,
        diffusers.SparseControlNetModel,
        motion_num_attention_heads=4,
        down_block_types=("CrossAttnDownBlockMotion", "DownBlockMotion"),
    )
    pipe = diffusers.AnimateDiffSparseControlNetPipeline(controlnet=controlnet, **components)
    return pipe, dict(
        call, **ONE_PROMPT, conditioning_frames=test_frames(2, seed=seed + 7), controlnet_frame_indices=[0, 2]
    )


def animatediff_sdxl(seed: int = 0):
    """AnimateDiff on SDXL's UNet: motion modules in both blocks."""
    pipe, call = tiny_unet.sdxl(seed)
    adapter = seeded(
        seed + 5,
        lambda: MotionAdapter(
            block_out_channels=(8, 16),
            motion_layers_per_block=2,
            motion_norm_num_groups=2,
            motion_num_attention_heads=4,
            use_motion_mid_block=False,
        ),
    )
    components = {k: v for k, v in pipe.components.items() if k not in ("scheduler",)}
    scheduler = DDIMScheduler(beta_schedule="linear", clip_sample=False, steps_offset=1, timestep_spacing="linspace")
    sdxl_pipe = diffusers.AnimateDiffSDXLPipeline(motion_adapter=adapter, scheduler=scheduler, **components)
    return sdxl_pipe, dict(call, num_frames=4)


def pia(seed: int = 0):
    """PIA: an image animated by SD 1.5's UNet with 9 input channels (noise, image latents, mask) and motion."""
    parts = tiny_unet._sd_parts(seed)
    parts["unet"] = seeded(seed, lambda: UNet2DConditionModel(**dict(tiny_unet.SD_UNET, in_channels=9)))
    for key in ("safety_checker", "requires_safety_checker"):
        parts.pop(key)
    adapter = seeded(
        seed + 3,
        lambda: MotionAdapter(
            block_out_channels=(8, 16),
            motion_layers_per_block=2,
            motion_norm_num_groups=2,
            motion_num_attention_heads=4,
        ),
    )
    pipe = PIAPipeline(motion_adapter=adapter, image_encoder=None, **parts)
    return pipe, dict(
        tiny_unet.PROMPTS, image=test_image(), height=32, width=32, num_frames=4, num_inference_steps=2, strength=1.0
    )


def i2vgen_xl(seed: int = 0):
    """I2VGen-XL: a 3-D UNet conditioned on the text, the image's CLIP embedding and its latents."""

    unet = seeded(
        seed,
        lambda: I2VGenXLUNet(
            block_out_channels=(8, 16),
            layers_per_block=2,
            sample_size=16,
            in_channels=4,
            out_channels=4,
            down_block_types=("CrossAttnDownBlock3D", "DownBlock3D"),
            up_block_types=("UpBlock3D", "CrossAttnUpBlock3D"),
            cross_attention_dim=32,
            attention_head_dim=4,
            num_attention_heads=None,
            norm_num_groups=4,
        ),
    )
    processor = getattr(transformers, "CLIPImageProcessorPil", transformers.CLIPImageProcessor)
    image_encoder = seeded(
        seed + 3, lambda: CLIPVisionModelWithProjection(CLIPVisionConfig(**dict(CLIP_VISION, projection_dim=32)))
    )
    pipe = I2VGenXLPipeline(
        vae=kl_vae(seed + 1),
        text_encoder=tiny_clip(seed + 2),
        tokenizer=char_tokenizer(77),
        image_encoder=image_encoder,
        feature_extractor=processor(crop_size=32, size=32),
        unet=unet,
        scheduler=DDIMScheduler(
            beta_schedule="squaredcos_cap_v2",
            clip_sample=False,
            rescale_betas_zero_snr=True,
            prediction_type="v_prediction",
        ),
    )
    return pipe, dict(
        ONE_PROMPT,
        image=test_image(),
        height=32,
        width=32,
        num_frames=4,
        num_inference_steps=2,
        # its default clip_skip=1 reads a module transformers 5 lacks
        decode_chunk_size=2,
        clip_skip=None,
    )


def text_to_video_zero(seed: int = 0):
    """Text2Video-Zero: SD 1.5 with cross-frame attention and a motion-field warp of the first frame's latents."""
    parts = tiny_unet._sd_parts(seed)
    return TextToVideoZeroPipeline(**parts), dict(
        ONE_PROMPT, video_length=3, height=32, width=32, num_inference_steps=4, t0=1, t1=2
    )


def text_to_video_zero_sdxl(seed: int = 0):
    pipe, call = tiny_unet.sdxl(seed)
    components = {k: v for k, v in pipe.components.items() if k != "force_zeros_for_empty_prompt"}
    pipe = TextToVideoZeroSDXLPipeline(**components, force_zeros_for_empty_prompt=False, add_watermarker=False)
    return pipe, dict(ONE_PROMPT, video_length=3, height=32, width=32, num_inference_steps=4, t0=1, t1=2)


def _easyanimate(seed, in_channels):
    pipe = easyanimate_pipeline(seed)
    return dict(pipe.components, transformer=rebuilt(seed, pipe.transformer, in_channels=in_channels))


def _video_tensor(frames, channels=3, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return torch.rand(1, channels, frames, 16, 16, generator=generator)


def easyanimate_inpaint(seed: int = 0):
    """EasyAnimate inpaint: noise, the mask and the masked video's latents side by side into the transformer."""
    components = _easyanimate(seed, 4 + 1 + 4)
    components["vae"].register_to_config(cache_mag_vae=True)  # the pipeline reads it; AutoencoderKLMagvit omits it
    pipe = diffusers.EasyAnimateInpaintPipeline(**components)
    mask = torch.zeros(1, 1, 5, 16, 16)
    mask[..., :, 8:] = 1.0
    return pipe, dict(
        ONE_PROMPT,
        video=_video_tensor(5, seed=seed),
        mask_video=mask,
        height=16,
        width=16,
        num_frames=5,
        num_inference_steps=2,
        guidance_scale=5.0,
        strength=1.0,
    )


def easyanimate_control(seed: int = 0):
    """EasyAnimate control: the control video's and a reference image's latents beside the noise."""
    pipe = diffusers.EasyAnimateControlPipeline(**_easyanimate(seed, 4 * 3))
    return pipe, dict(
        ONE_PROMPT,
        control_video=_video_tensor(5, seed=seed),
        ref_image=_video_tensor(1, seed=seed + 1),
        height=16,
        width=16,
        num_frames=5,
        num_inference_steps=2,
        guidance_scale=5.0,
    )


def helios_pyramid(base):
    """Helios' pyramid sampler (``base``: Helios' tiny ``(pipe, call)``): two resolution stages over the same
    transformer."""
    pipe, call = base
    components = dict(pipe.components, scheduler=HeliosScheduler(stages=2, stage_range=[0, 0.5, 1], gamma=0.25))
    call = {k: v for k, v in call.items() if k != "num_inference_steps"}
    return HeliosPyramidPipeline(**components), dict(call, pyramid_num_inference_steps_list=[2, 2])


def ltx2_reference(seed: int = 0, cls_name: str = "LTX2InContextPipeline"):
    """LTX-2's in-context (IC-LoRA) and HDR classes: a reference video encoded into extra tokens beside the noise."""

    pipe, call = pipeline("ltx2", seed)
    parts = dict(pipe.components, audio_scheduler=FlowMatchEulerDiscreteScheduler())
    reference = LTX2ReferenceCondition(frames=test_frames(5, seed=seed + 7), strength=1.0)
    return fit(cls_name, parts, dict(call, reference_conditions=[reference]))


def ltx_long_multi_prompt(seed: int = 0):
    """LTX image-to-video over temporal tiles, one prompt per segment."""

    pipe, call = pipeline("ltx", seed)
    call = dict(
        call,
        prompt="a cat walks on the grass | the cat sits down",
        negative_prompt="blurry",
        cond_image=test_image(),
        num_frames=17,
        temporal_tile_size=9,
        temporal_overlap=1,
    )
    return LTXI2VLongMultiPromptPipeline(**pipe.components), call


def sana_i2v(base):
    """Sana Video's image-to-video class (``base``: Sana Video's tiny ``(pipe, call)``): the first frame's latents
    fixed."""
    pipe, call = base
    return SanaImageToVideoPipeline(**pipe.components), dict(call, image=test_image())


def cosmos2(seed: int = 0, cls_name: str = "Cosmos2TextToImagePipeline"):
    """Cosmos 2 (text-to-image, video-to-world): its transformer, Wan's VAE, T5. Without the padding-mask channel
    (``concat_padding_mask``): resizing that mask needs torchvision, which this environment lacks."""

    transformer = seeded(
        seed,
        lambda: CosmosTransformer3DModel(
            in_channels=16 + ("Video" in cls_name),
            out_channels=16,
            num_attention_heads=2,
            attention_head_dim=16,
            num_layers=2,
            mlp_ratio=2,
            text_embed_dim=32,
            adaln_lora_dim=4,
            max_size=(4, 32, 32),
            patch_size=(1, 2, 2),
            rope_scale=(2.0, 1.0, 1.0),
            concat_padding_mask=False,
            extra_pos_embed_type=None,
        ),
    )
    pipe = getattr(diffusers, cls_name)(
        text_encoder=tiny_t5(seed + 2),
        tokenizer=char_tokenizer(),
        transformer=transformer,
        vae=seeded(seed + 1, lambda: AutoencoderKLWan(**WAN_VAE)),
        scheduler=FlowMatchEulerDiscreteScheduler(use_karras_sigmas=True),
        safety_checker=PassThroughGuardrail(),
    )
    call = dict(
        tiny_unet.PROMPTS, height=32, width=32, num_inference_steps=2, guidance_scale=7.0, max_sequence_length=48
    )
    if "Video" in cls_name:  # the first frame given, five generated
        call = dict(call, **ONE_PROMPT, image=test_image(), num_frames=5)
    return pipe, call


def cosmos1(seed: int = 0, cls_name: str = "CosmosTextToWorldPipeline"):
    """Cosmos 1.0 (text-to-world, video-to-world): its own causal VAE (Haar patches, 4x4x4 compression), EDM's
    Euler sampler, a learnable extra position embedding; without the padding-mask channel (see ``cosmos2``)."""

    video = "Video" in cls_name
    transformer = seeded(
        seed,
        lambda: CosmosTransformer3DModel(
            in_channels=4 + video,
            out_channels=4,
            num_attention_heads=2,
            attention_head_dim=16,
            num_layers=2,
            mlp_ratio=2,
            text_embed_dim=32,
            adaln_lora_dim=4,
            max_size=(4, 32, 32),
            patch_size=(1, 2, 2),
            rope_scale=(2.0, 1.0, 1.0),
            concat_padding_mask=False,
            extra_pos_embed_type="learnable",
        ),
    )
    vae = seeded(
        seed + 1,
        lambda: AutoencoderKLCosmos(
            in_channels=3,
            out_channels=3,
            latent_channels=4,
            encoder_block_out_channels=(8, 8, 8, 8),
            decode_block_out_channels=(8, 8, 8, 8),
            attention_resolutions=(8,),
            resolution=64,
            num_layers=2,
            patch_size=4,
            patch_type="haar",
            scaling_factor=1.0,
            spatial_compression_ratio=4,
            temporal_compression_ratio=4,
            latents_mean=None,
            latents_std=None,
        ),
    )
    scheduler = EDMEulerScheduler(
        sigma_min=0.002,
        sigma_max=80,
        sigma_data=0.5,
        sigma_schedule="karras",
        num_train_timesteps=1000,
        prediction_type="epsilon",
        rho=7.0,
        final_sigmas_type="sigma_min",
    )
    pipe = getattr(diffusers, cls_name)(
        text_encoder=tiny_t5(seed + 2),
        tokenizer=char_tokenizer(),
        transformer=transformer,
        vae=vae,
        scheduler=scheduler,
        safety_checker=PassThroughGuardrail(),
    )
    call = dict(
        ONE_PROMPT, height=32, width=32, num_frames=9, num_inference_steps=2, guidance_scale=7.0, max_sequence_length=48
    )
    if video:
        call["image"] = test_image()
    return pipe, call


def hunyuan_framepack(seed: int = 0):
    """HunyuanVideo FramePack: HunyuanVideo 1.0's tiny text encoders and VAE, the FramePack transformer (history
    latents at 1x/2x/4x, a SigLIP image projection), sections of frames generated back to front."""

    pipe, call = hunyuan_video(seed)
    transformer = seeded(
        seed,
        lambda: HunyuanVideoFramepackTransformer3DModel(
            in_channels=4,
            out_channels=4,
            num_attention_heads=4,
            attention_head_dim=8,
            num_layers=2,
            num_single_layers=2,
            num_refiner_layers=2,
            patch_size=2,
            patch_size_t=1,
            guidance_embeds=True,
            text_embed_dim=16,
            pooled_projection_dim=8,
            rope_axes_dim=(2, 2, 4),
            image_condition_type=None,
            has_image_proj=True,
            image_proj_dim=32,
            has_clean_x_embedder=True,
        ),
    )
    image_encoder = seeded(
        seed + 5,
        lambda: SiglipVisionModel(
            SiglipVisionConfig(
                hidden_size=32,
                intermediate_size=37,
                num_hidden_layers=2,
                num_attention_heads=4,
                image_size=32,
                patch_size=8,
            )
        ),
    )
    components = dict(
        pipe.components,
        transformer=transformer,
        image_encoder=image_encoder,
        feature_extractor=SiglipImageProcessor(size={"height": 32, "width": 32}),
    )
    call = dict(call, **ONE_PROMPT, image=test_image(), height=32, width=32, num_frames=9, latent_window_size=3)
    return HunyuanVideoFramepackPipeline(**components), call


def motif(seed: int = 0, cls_name: str = "MotifVideoPipeline"):
    """Motif-Video (text- and image-to-video): a T5Gemma-2 encoder (its SigLIP tower embeds the first frame), the
    transformer taking noise, the first frame's latents and their mask (33 channels at full size), guidance
    through diffusers' guider."""
    transformer = seeded(
        seed,
        lambda: MotifVideoTransformer3DModel(
            in_channels=33,
            out_channels=16,
            num_attention_heads=4,
            attention_head_dim=8,
            num_layers=2,
            num_single_layers=2,
            patch_size=2,
            patch_size_t=1,
            text_embed_dim=32,
            image_embed_dim=16,
            rope_axes_dim=(2, 2, 4),
        ),
    )
    config = T5Gemma2EncoderConfig(
        text_config=dict(
            hidden_size=32,
            intermediate_size=37,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=16,
            vocab_size=128,
            max_position_embeddings=256,
            pad_token_id=0,
            eos_token_id=1,
            bos_token_id=2,
            sliding_window=64,
        ),
        vision_config=dict(
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            image_size=32,
            patch_size=8,
        ),
        mm_tokens_per_image=4,
        boi_token_index=125,
        eoi_token_index=126,
        image_token_index=127,
    )
    config.text_config.dropout_rate = 0.0  # set by the encoder-decoder config that real checkpoints ship
    text_encoder = seeded(seed + 2, lambda: T5Gemma2Encoder(config, eoi_token_index=126))
    pipe = getattr(diffusers, cls_name)(
        scheduler=FlowMatchEulerDiscreteScheduler(shift=5.0),
        vae=seeded(seed + 1, lambda: AutoencoderKLWan(**WAN_VAE)),
        text_encoder=text_encoder,
        tokenizer=char_tokenizer(),
        transformer=transformer,
        guider=ClassifierFreeGuidance(guidance_scale=5.0),
        feature_extractor=SiglipImageProcessor(size={"height": 32, "width": 32}),
    )
    call = dict(tiny_unet.PROMPTS, height=32, width=32, num_frames=5, num_inference_steps=2, max_sequence_length=48)
    if "Image2Video" in cls_name:  # one image, one prompt
        call = dict(call, **ONE_PROMPT, image=test_image())
    return pipe, call


def ltx_latent_upsample(seed: int = 0, ltx2: bool = False):
    """LTX's (or LTX-2's) latent upsampler behind its VAE, no denoiser: a 9-frame video encoded, its latents
    upsampled 2x in space, AdaIN-filtered against the input's, tone-mapped, decoded."""
    from diffusers import LTX2LatentUpsamplePipeline, LTXLatentUpsamplePipeline
    from diffusers.pipelines.ltx.modeling_latent_upsampler import LTXLatentUpsamplerModel
    from diffusers.pipelines.ltx2.latent_upsampler import LTX2LatentUpsamplerModel

    pipe, _ = pipeline("ltx2" if ltx2 else "ltx", seed)
    model = LTX2LatentUpsamplerModel if ltx2 else LTXLatentUpsamplerModel
    upsampler = seeded(
        seed + 3,
        lambda: model(  # GroupNorm(32, mid_channels)
            in_channels=pipe.vae.config.latent_channels, mid_channels=32, num_blocks_per_stage=1, dims=3
        ),
    ).eval()
    cls = LTX2LatentUpsamplePipeline if ltx2 else LTXLatentUpsamplePipeline
    call = dict(video=[test_image(32, 32, seed=i) for i in range(9)], height=32, width=32)
    call.update(adain_factor=0.5, tone_map_compression_ratio=0.3)
    if ltx2:
        call.update(num_frames=9)
    return cls(vae=pipe.vae, latent_upsampler=upsampler), call
