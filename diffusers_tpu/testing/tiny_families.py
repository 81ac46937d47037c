"""Tiny offline pipelines of the newer first-class families (2+ layers, 4 heads, padded prompts of different
lengths): Wan's wider family. Built from the same pieces as ``tiny``.

Over 400 lines: one small builder per pipeline, written out as ``ruff format`` lays them."""

from __future__ import annotations

import inspect

import numpy as np
import PIL.Image
import torch
import transformers
from diffusers import (
    AutoencoderKLHunyuanVideo,
    AutoencoderKLLTX2Audio,
    AutoencoderKLLTX2Video,
    AutoencoderKLLTXVideo,
    AutoencoderKLWan,
    FlowMatchEulerDiscreteScheduler,
    HunyuanVideo15ImageToVideoPipeline,
    HunyuanVideo15Transformer3DModel,
    HunyuanVideoPipeline,
    HunyuanVideoTransformer3DModel,
    LTX2ImageToVideoPipeline,
    LTX2Pipeline,
    LTX2VideoTransformer3DModel,
    LTXImageToVideoPipeline,
    LTXPipeline,
    LTXVideoTransformer3DModel,
    SkyReelsV2DiffusionForcingPipeline,
    SkyReelsV2Pipeline,
    SkyReelsV2Transformer3DModel,
    UniPCMultistepScheduler,
    WanAnimatePipeline,
    WanAnimateTransformer3DModel,
    WanTransformer3DModel,
    WanVACEPipeline,
    WanVACETransformer3DModel,
    WanVideoToVideoPipeline,
)
from diffusers.pipelines.ltx2 import LTX2TextConnectors
from diffusers.pipelines.ltx2.vocoder import LTX2Vocoder
from transformers import (
    CLIPTextConfig,
    CLIPTextModel,
    CLIPVisionConfig,
    CLIPVisionModel,
    Gemma3Config,
    Gemma3ForConditionalGeneration,
    LlamaConfig,
    LlamaModel,
    SiglipVisionConfig,
    SiglipVisionModel,
)

from .tiny import (
    CLIP_VISION,
    HUNYUAN15_LENGTHS,
    HUNYUAN15_TRANSFORMER,
    WAN_I2V_TRANSFORMER,
    WAN_TRANSFORMERS,
    WAN_VAE,
    char_tokenizer,
    hunyuan15_pipeline,
    test_image,
    tiny_t5,
    tiny_umt5,
)

PROMPTS = dict(
    prompt=["a cat walks on the grass", "a red fox jumps over a sleeping dog in the snow"],
    negative_prompt=["blurry", "low quality, static, deformed"],
)


def _wan_parts(seed: int) -> dict:
    torch.manual_seed(seed + 1)
    return dict(vae=AutoencoderKLWan(**WAN_VAE).eval(), text_encoder=tiny_umt5(seed + 2), tokenizer=char_tokenizer())


def test_frames(count: int = 9, size: int = 32, seed: int = 0) -> list:
    rng = np.random.default_rng(seed)
    return [PIL.Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)) for _ in range(count)]


def _flow(shift: float = 7.0):
    return FlowMatchEulerDiscreteScheduler(shift=shift)


def unipc():
    return UniPCMultistepScheduler(flow_shift=8.0, use_flow_sigmas=True, prediction_type="flow_prediction")


def wan_v2v(seed: int = 0):
    torch.manual_seed(seed)
    transformer = WanTransformer3DModel(**WAN_TRANSFORMERS["wan-4head"]).eval()
    pipe = WanVideoToVideoPipeline(transformer=transformer, scheduler=_flow(), **_wan_parts(seed))
    return pipe, dict(PROMPTS, video=test_frames(), height=32, width=32, num_inference_steps=3, strength=0.8)


def wan_vace(seed: int = 0):
    torch.manual_seed(seed)
    transformer = WanVACETransformer3DModel(
        **WAN_TRANSFORMERS["wan-4head"], vace_layers=[0, 2], vace_in_channels=96
    ).eval()
    pipe = WanVACEPipeline(transformer=transformer, scheduler=_flow(), **_wan_parts(seed))
    mask = PIL.Image.fromarray(((np.arange(32)[None, :] > 16) * 255).astype(np.uint8).repeat(32, 0))
    # VACE takes one prompt per call (stock: "batching is not yet supported")
    return pipe, dict(
        prompt="a cat walks on the grass",
        negative_prompt="blurry, low quality",
        video=test_frames(),
        mask=[mask] * 9,
        height=32,
        width=32,
        num_frames=9,
        num_inference_steps=2,
        max_sequence_length=16,
    )


def wan_animate(seed: int = 0):
    """Wan-Animate in miniature: the I2V transformer plus pose latents, a 16-pixel face motion encoder and a face
    adapter in every block; the character image, pose and face videos are random frames. The model splits its
    context at 512 text tokens (image tokens first), so the prompt is padded to 512 as in real use."""

    torch.manual_seed(seed)
    transformer = WanAnimateTransformer3DModel(
        **WAN_I2V_TRANSFORMER,
        latent_channels=16,
        motion_encoder_channel_sizes={"16": 8, "8": 8, "4": 8},
        motion_encoder_size=16,
        motion_style_dim=16,
        motion_dim=4,
        motion_encoder_dim=16,
        face_encoder_hidden_dim=16,
        face_encoder_num_heads=2,
        inject_face_latents_blocks=1,
        motion_encoder_batch_size=4,
    ).eval()
    torch.manual_seed(seed + 3)
    image_encoder = CLIPVisionModel(CLIPVisionConfig(**CLIP_VISION)).eval()
    processor_cls = getattr(transformers, "CLIPImageProcessorPil", transformers.CLIPImageProcessor)  # no torchvision
    pipe = WanAnimatePipeline(
        transformer=transformer,
        scheduler=_flow(),
        image_encoder=image_encoder,
        image_processor=processor_cls(crop_size=32, size=32),
        **_wan_parts(seed),
    )
    return pipe, dict(
        prompt="a cat walks on the grass",
        negative_prompt="blurry, low quality",
        image=test_image(32, 32),
        pose_video=test_frames(9, 32, seed=1),
        face_video=test_frames(9, 16, seed=2),
        height=32,
        width=32,
        segment_frame_length=9,
        num_inference_steps=2,
        guidance_scale=2.0,
        max_sequence_length=512,
    )


def skyreels_v2(seed: int = 0):
    torch.manual_seed(seed)
    transformer = SkyReelsV2Transformer3DModel(**WAN_TRANSFORMERS["wan-4head"]).eval()
    pipe = SkyReelsV2Pipeline(transformer=transformer, scheduler=unipc(), **_wan_parts(seed))
    return pipe, dict(PROMPTS, height=32, width=32, num_frames=9, num_inference_steps=2, max_sequence_length=16)


def skyreels_v2_df(seed: int = 0):
    torch.manual_seed(seed)
    transformer = SkyReelsV2Transformer3DModel(**WAN_TRANSFORMERS["wan-4head"]).eval()
    pipe = SkyReelsV2DiffusionForcingPipeline(transformer=transformer, scheduler=unipc(), **_wan_parts(seed))
    # diffusion forcing: frames one block behind each other (ar_step), a block-causal mask per frame
    return pipe, dict(
        prompt="a cat walks on the grass",
        negative_prompt="blurry, low quality",
        height=32,
        width=32,
        num_frames=9,
        num_inference_steps=2,
        max_sequence_length=16,
        ar_step=1,
        causal_block_size=1,
    )


def _ltx(cls, seed: int):

    torch.manual_seed(seed)
    transformer = LTXVideoTransformer3DModel(
        in_channels=8,
        out_channels=8,
        patch_size=1,
        patch_size_t=1,
        num_attention_heads=4,
        attention_head_dim=8,
        cross_attention_dim=32,
        num_layers=2,
        caption_channels=32,
    )
    torch.manual_seed(seed + 1)
    vae = AutoencoderKLLTXVideo(
        latent_channels=8,
        block_out_channels=(8,) * 4,
        decoder_block_out_channels=(8,) * 4,
        spatio_temporal_scaling=(True, True, False, False),
        decoder_spatio_temporal_scaling=(True, True, False, False),
        layers_per_block=(1,) * 5,
        decoder_layers_per_block=(1,) * 5,
        patch_size=1,
        patch_size_t=1,
        encoder_causal=True,
        decoder_causal=False,
    )
    vae.use_framewise_encoding = vae.use_framewise_decoding = False
    return cls(
        transformer=transformer.eval(),
        vae=vae.eval(),
        scheduler=FlowMatchEulerDiscreteScheduler(),
        text_encoder=tiny_t5(seed + 2),
        tokenizer=char_tokenizer(),
    )


LTX_CALL = dict(
    PROMPTS, num_inference_steps=2, guidance_scale=3.0, height=32, width=32, num_frames=9, max_sequence_length=64
)


def ltx(seed: int = 0):
    return _ltx(LTXPipeline, seed), dict(LTX_CALL)


def ltx_i2v(seed: int = 0):

    return _ltx(LTXImageToVideoPipeline, seed), dict(LTX_CALL, image=test_image(32, 32))


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


def gemma3_config(hidden_size: int = 16, max_positions: int = 256) -> Gemma3Config:
    """A tiny Gemma-3 (2 text layers, a 1-layer vision tower, a 128-token vocabulary): LTX-2's text encoder."""
    text = dict(hidden_size=hidden_size, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2)
    text.update(num_key_value_heads=1, head_dim=8, vocab_size=128, max_position_embeddings=max_positions)
    text.update(pad_token_id=0, eos_token_id=1, bos_token_id=2, sliding_window=64)
    vision = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=16)
    return Gemma3Config(
        text_config=text,
        vision_config=dict(vision, patch_size=8),
        mm_tokens_per_image=4,
        image_token_index=127,
        boi_token_index=125,
        eoi_token_index=126,
    )


def _ltx2(cls, seed: int):
    """LTX-2 in miniature: video and audio transformer streams, a Gemma-3 text encoder whose hidden states feed the
    text connectors, the video and audio VAEs and the vocoder (diffusers' own test shapes, 4 heads)."""
    torch.manual_seed(seed + 2)
    text_encoder = Gemma3ForConditionalGeneration(gemma3_config()).eval()
    hidden = 16
    torch.manual_seed(seed)
    transformer = LTX2VideoTransformer3DModel(
        in_channels=4,
        out_channels=4,
        patch_size=1,
        patch_size_t=1,
        num_attention_heads=4,
        attention_head_dim=8,
        cross_attention_dim=32,
        audio_in_channels=4,
        audio_out_channels=4,
        audio_num_attention_heads=4,
        audio_attention_head_dim=4,
        audio_cross_attention_dim=16,
        num_layers=2,
        qk_norm="rms_norm_across_heads",
        caption_channels=hidden,
        rope_double_precision=False,
        rope_type="split",
    ).eval()
    torch.manual_seed(seed + 3)
    connectors = LTX2TextConnectors(
        caption_channels=hidden,
        text_proj_in_factor=3,
        video_connector_num_attention_heads=2,
        video_connector_attention_head_dim=8,
        video_connector_num_layers=1,
        video_connector_num_learnable_registers=None,
        audio_connector_num_attention_heads=2,
        audio_connector_attention_head_dim=8,
        audio_connector_num_layers=1,
        audio_connector_num_learnable_registers=None,
        connector_rope_base_seq_len=32,
        rope_theta=10000.0,
        rope_double_precision=False,
        causal_temporal_positioning=False,
        rope_type="split",
    ).eval()
    torch.manual_seed(seed + 1)
    vae = AutoencoderKLLTX2Video(
        in_channels=3,
        out_channels=3,
        latent_channels=4,
        block_out_channels=(8,),
        decoder_block_out_channels=(8,),
        layers_per_block=(1,),
        decoder_layers_per_block=(1, 1),
        spatio_temporal_scaling=(True,),
        decoder_spatio_temporal_scaling=(True,),
        decoder_inject_noise=(False, False),
        downsample_type=("spatial",),
        upsample_residual=(False,),
        upsample_factor=(1,),
        timestep_conditioning=False,
        patch_size=1,
        patch_size_t=1,
        encoder_causal=True,
        decoder_causal=False,
    ).eval()
    vae.use_framewise_encoding = vae.use_framewise_decoding = False
    torch.manual_seed(seed + 4)
    audio_vae = AutoencoderKLLTX2Audio(
        base_channels=4,
        output_channels=2,
        ch_mult=(1,),
        num_res_blocks=1,
        attn_resolutions=None,
        in_channels=2,
        resolution=32,
        latent_channels=2,
        norm_type="pixel",
        causality_axis="height",
        dropout=0.0,
        mid_block_add_attention=False,
        sample_rate=16000,
        mel_hop_length=160,
        is_causal=True,
        mel_bins=8,
    ).eval()
    torch.manual_seed(seed + 5)
    vocoder = LTX2Vocoder(
        in_channels=16,
        hidden_channels=32,
        out_channels=2,
        upsample_kernel_sizes=[4, 4],
        upsample_factors=[2, 2],
        resnet_kernel_sizes=[3],
        resnet_dilations=[[1, 3, 5]],
        leaky_relu_negative_slope=0.1,
        output_sampling_rate=16000,
    ).eval()
    return cls(
        scheduler=FlowMatchEulerDiscreteScheduler(),
        vae=vae,
        audio_vae=audio_vae,
        text_encoder=text_encoder,
        tokenizer=char_tokenizer(),
        connectors=connectors,
        transformer=transformer,
        vocoder=vocoder,
    )


LTX2_CALL = dict(
    PROMPTS,
    guidance_scale=3.0,
    stg_scale=0.0,
    modality_scale=1.0,
    guidance_rescale=0.0,
    audio_guidance_scale=3.0,
    audio_stg_scale=0.0,
    audio_modality_scale=1.0,
    audio_guidance_rescale=0.0,
    spatio_temporal_guidance_blocks=None,
    use_cross_timestep=False,
    height=32,
    width=32,
    num_frames=5,
    frame_rate=25.0,
    num_inference_steps=2,
    max_sequence_length=48,
)


def ltx2(seed: int = 0):
    return _ltx2(LTX2Pipeline, seed), dict(LTX2_CALL)


def ltx2_i2v(seed: int = 0):
    call = dict(LTX2_CALL, image=test_image(32, 32))
    if "image_crf" in inspect.signature(LTX2ImageToVideoPipeline.__call__).parameters:  # newer diffusers
        call["image_crf"] = 0  # no H.264 re-compression of the conditioning image (it needs PyAV, not a dependency)
    return _ltx2(LTX2ImageToVideoPipeline, seed), call


PIPELINES = {
    "hunyuan-video": hunyuan_video,
    "ltx2": ltx2,
    "ltx2-i2v": ltx2_i2v,
    "hunyuanvideo15-i2v": hunyuan15_i2v,
    "ltx": ltx,
    "ltx-i2v": ltx_i2v,
    "wan-v2v": wan_v2v,
    "wan-vace": wan_vace,
    "wan-animate": wan_animate,
    "skyreels-v2": skyreels_v2,
    "skyreels-v2-df": skyreels_v2_df,
}


def pipeline(name: str, seed: int = 0):
    """``(pipe, call arguments)`` for a tiny pipeline of a newer family."""
    if name not in PIPELINES:
        raise ValueError(f"No tiny pipeline {name!r}; choose one of {sorted(PIPELINES)}.")
    return PIPELINES[name](seed)
