"""Tiny offline LTX-Video and LTX-2 pipelines (text- and image-to-video; LTX-2 with its audio VAE, vocoder and a tiny
Gemma-3 text encoder)."""

from __future__ import annotations

import inspect

import torch
from diffusers import (
    AutoencoderKLLTX2Audio,
    AutoencoderKLLTX2Video,
    AutoencoderKLLTXVideo,
    FlowMatchEulerDiscreteScheduler,
    LTX2ImageToVideoPipeline,
    LTX2Pipeline,
    LTX2VideoTransformer3DModel,
    LTXImageToVideoPipeline,
    LTXPipeline,
    LTXVideoTransformer3DModel,
)
from diffusers.pipelines.ltx2 import LTX2TextConnectors
from diffusers.pipelines.ltx2.vocoder import LTX2Vocoder
from transformers import (
    Gemma3Config,
    Gemma3ForConditionalGeneration,
)

from ..planner.standins import char_tokenizer
from .tiny_parts import PROMPTS, test_image, tiny_t5


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
