"""Tiny offline components for pipelines that only the parity sweep builds (SD3, PixArt, AuraFlow, Sana, Allegro,
CogView, HunyuanDiT, Lumina, Chroma, ...): each ``(pipe, call arguments)``, 2+ layers, heads that tp=2 divides,
the character tokenizer with prompts of different lengths.

Over 400 lines: the sweep's shared tiny components and one builder per class, written out as ``ruff format``
lays them (one argument a line)."""

from __future__ import annotations

import diffusers
import numpy as np
import torch
import transformers
from diffusers import (
    AllegroPipeline,
    AllegroTransformer3DModel,
    AnimateDiffVideoToVideoPipeline,
    AnyFlowFARPipeline,
    AnyFlowFARTransformer3DModel,
    AnyFlowPipeline,
    AnyFlowTransformer3DModel,
    AuraFlowPipeline,
    AuraFlowTransformer2DModel,
    AutoencoderDC,
    AutoencoderKLAllegro,
    AutoencoderKLWan,
    ChromaTransformer2DModel,
    ChronoEditPipeline,
    ChronoEditTransformer3DModel,
    CogVideoXDDIMScheduler,
    CogVideoXTransformer3DModel,
    CogView3PlusPipeline,
    CogView3PlusTransformer2DModel,
    CogView4Pipeline,
    CogView4Transformer2DModel,
    DDIMScheduler,
    DDPMScheduler,
    DPMSolverMultistepScheduler,
    FlowMapEulerDiscreteScheduler,
    FlowMatchEulerDiscreteScheduler,
    HeliosPipeline,
    HeliosScheduler,
    HeliosTransformer3DModel,
    HunyuanDiT2DModel,
    HunyuanSkyreelsImageToVideoPipeline,
    HunyuanVideoTransformer3DModel,
    LucyEditPipeline,
    Lumina2Pipeline,
    Lumina2Transformer2DModel,
    PixArtTransformer2DModel,
    SanaTransformer2DModel,
    SanaVideoPipeline,
    SanaVideoTransformer3DModel,
    SD3Transformer2DModel,
    SkyReelsV2Transformer3DModel,
    UNet3DConditionModel,
    WanTransformer3DModel,
)
from transformers import (
    BertConfig,
    BertModel,
    CLIPTextConfig,
    CLIPTextModelWithProjection,
    CLIPVisionConfig,
    CLIPVisionModel,
    CLIPVisionModelWithProjection,
    GlmConfig,
    GlmModel,
    MT5Config,
    T5EncoderModel,
)

from diffusers_tpu.testing.tiny import (
    CLIP_VISION,
    COGVIDEOX_TRANSFORMERS,
    WAN_I2V_TRANSFORMER,
    WAN_TRANSFORMERS,
    WAN_VAE,
    char_tokenizer,
    cogvideox_components,
    wan_components,
)
from diffusers_tpu.testing.tiny_families import test_frames, unipc
from diffusers_tpu.testing.tiny_hunyuan import hunyuan_video
from diffusers_tpu.testing.tiny_parts import kl_vae, seeded, test_image, tiny_clip, tiny_gemma2, tiny_t5, tiny_umt5
from diffusers_tpu.testing.tiny_unet import animatediff

PROMPTS = dict(
    prompt=["a cat on the grass", "a red fox jumps over a sleeping dog in the snow"],
    negative_prompt=["blurry", "low quality, deformed"],
)
IMAGE_CALL = dict(PROMPTS, height=32, width=32, num_inference_steps=2)


def clip_with_projection(seed: int, hidden: int = 32):
    return seeded(
        seed,
        lambda: CLIPTextModelWithProjection(
            CLIPTextConfig(
                hidden_size=hidden,
                intermediate_size=37,
                num_attention_heads=4,
                num_hidden_layers=2,
                projection_dim=hidden,
                max_position_embeddings=77,
                vocab_size=128,
                bos_token_id=None,
                eos_token_id=1,
                pad_token_id=0,
            )
        ),
    )


def sd3(seed: int = 0, cls_name: str = "StableDiffusion3Pipeline"):
    latent = 16 if "Inpaint" in cls_name else 4  # the inpaint pipeline insists on SD3's 16 latent channels
    transformer = seeded(
        seed,
        lambda: SD3Transformer2DModel(
            sample_size=32,
            patch_size=1,
            in_channels=latent,
            num_layers=2,
            attention_head_dim=8,
            num_attention_heads=4,
            caption_projection_dim=32,
            joint_attention_dim=32,
            pooled_projection_dim=64,
            out_channels=latent,
        ),
    )
    pipe = getattr(diffusers, cls_name)(
        transformer=transformer,
        scheduler=FlowMatchEulerDiscreteScheduler(),
        vae=kl_vae(seed + 1, latent),
        text_encoder=clip_with_projection(seed + 2),
        tokenizer=char_tokenizer(77),
        text_encoder_2=clip_with_projection(seed + 3),
        tokenizer_2=char_tokenizer(77),
        text_encoder_3=tiny_t5(seed + 4),
        tokenizer_3=char_tokenizer(),
    )
    return pipe, dict(IMAGE_CALL, guidance_scale=5.0, max_sequence_length=48)


def pixart(seed: int = 0, cls_name: str = "PixArtSigmaPipeline"):
    transformer = seeded(
        seed,
        lambda: PixArtTransformer2DModel(
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
        ),
    )
    pipe = getattr(diffusers, cls_name)(
        transformer=transformer,
        vae=kl_vae(seed + 1),
        scheduler=DPMSolverMultistepScheduler(),
        text_encoder=tiny_t5(seed + 2),
        tokenizer=char_tokenizer(),
    )
    return pipe, dict(
        IMAGE_CALL, guidance_scale=4.5, clean_caption=False, max_sequence_length=48, use_resolution_binning=False
    )


def auraflow(seed: int = 0):
    transformer = seeded(
        seed,
        lambda: AuraFlowTransformer2DModel(
            sample_size=32,
            patch_size=2,
            in_channels=4,
            num_mmdit_layers=1,
            num_single_dit_layers=2,
            attention_head_dim=8,
            num_attention_heads=4,
            joint_attention_dim=32,
            caption_projection_dim=32,
            out_channels=4,
            pos_embed_max_size=64,
        ),
    )
    pipe = AuraFlowPipeline(
        transformer=transformer,
        vae=kl_vae(seed + 1),
        scheduler=FlowMatchEulerDiscreteScheduler(),
        text_encoder=tiny_umt5(seed + 2),
        tokenizer=char_tokenizer(),
    )
    return pipe, dict(IMAGE_CALL, guidance_scale=5.0, max_sequence_length=48)


def sana(seed: int = 0, cls_name: str = "SanaPipeline"):
    transformer = seeded(
        seed,
        lambda: SanaTransformer2DModel(
            in_channels=4,
            out_channels=4,
            num_attention_heads=2,
            attention_head_dim=8,
            num_layers=2,
            num_cross_attention_heads=2,
            cross_attention_head_dim=8,
            cross_attention_dim=16,
            caption_channels=32,
            sample_size=16,
            patch_size=1,
            attention_bias=True,
        ),
    )  # 16: resolution binning's 512 px bins
    with torch.no_grad():  # ReLU linear attention divides by sum(relu(q)·relu(k)): random weights leave it near 0 for
        for block in transformer.transformer_blocks:  # some tokens, then fp32 rounding decides; keep it well away
            block.attn1.to_q.bias.fill_(1.0)
            block.attn1.to_k.bias.fill_(1.0)
    # DC-AE's 32x compression (six blocks, as Sana's): the 512 px the pipeline bins a 32 px request to are 16x16 latents
    blocks, multiscales = ("ResBlock",) * 5 + ("EfficientViTBlock",), ((),) * 5 + ((5,),)
    vae = seeded(
        seed + 1,
        lambda: AutoencoderDC(
            in_channels=3,
            latent_channels=4,
            attention_head_dim=2,
            encoder_block_types=blocks,
            decoder_block_types=blocks,
            encoder_block_out_channels=(8,) * 6,
            decoder_block_out_channels=(8,) * 6,
            encoder_qkv_multiscales=multiscales,
            decoder_qkv_multiscales=multiscales,
            encoder_layers_per_block=(1,) * 6,
            decoder_layers_per_block=[1] * 6,
            downsample_block_type="conv",
            upsample_block_type="interpolate",
            decoder_norm_types="rms_norm",
            decoder_act_fns="silu",
            scaling_factor=0.41407,
        ),
    )
    tokenizer = char_tokenizer()
    pipe = getattr(diffusers, cls_name)(
        transformer=transformer,
        vae=vae,
        scheduler=FlowMatchEulerDiscreteScheduler(),
        text_encoder=tiny_gemma2(seed + 2),
        tokenizer=tokenizer,
    )
    return pipe, dict(
        IMAGE_CALL, guidance_scale=4.5, clean_caption=False, max_sequence_length=48, complex_human_instruction=None
    )


def allegro(seed: int = 0):
    transformer = seeded(
        seed,
        lambda: AllegroTransformer3DModel(  # RoPE: the head splits in 3 even parts
            num_attention_heads=2,
            attention_head_dim=12,
            in_channels=4,
            out_channels=4,
            num_layers=2,
            cross_attention_dim=24,
            sample_width=8,
            sample_height=8,
            sample_frames=8,
            caption_channels=32,
        ),
    )
    vae = seeded(
        seed + 1,
        lambda: AutoencoderKLAllegro(
            in_channels=3,
            out_channels=3,
            down_block_types=("AllegroDownBlock3D",) * 4,
            up_block_types=("AllegroUpBlock3D",) * 4,
            block_out_channels=(8, 8, 8, 8),
            latent_channels=4,
            layers_per_block=1,
            norm_num_groups=2,
            temporal_compression_ratio=4,
        ),
    )
    # Its only decode path is tiled, over stock's fixed 24-frame 320-px tiles (instance attributes): none fits a tiny
    # video, and stock then returns zeros. Tiles of 12 frames x 32 px, overlapping by 16 px: 2 x 2 blended tiles.
    vae.enable_tiling()
    vae.tile_overlap_t, vae.tile_overlap_h, vae.tile_overlap_w = 4, 16, 16
    vae.kernel = (12, 32, 32)
    vae.stride = (8, 16, 16)
    pipe = AllegroPipeline(
        transformer=transformer,
        vae=vae,
        scheduler=DDIMScheduler(),
        text_encoder=tiny_t5(seed + 2),
        tokenizer=char_tokenizer(),
    )
    # one prompt: stock's tiled decode holds one video (``local_batch_size = 1``)
    return pipe, dict(
        prompt="a red fox jumps over a sleeping dog in the snow",
        negative_prompt="blurry",
        height=48,
        width=48,
        num_frames=9,
        num_inference_steps=2,
        guidance_scale=7.5,
        clean_caption=False,
        max_sequence_length=48,
    )


def cogview3(seed: int = 0):
    transformer = seeded(
        seed,
        lambda: CogView3PlusTransformer2DModel(
            patch_size=2,
            in_channels=4,
            num_layers=2,
            attention_head_dim=8,
            num_attention_heads=4,
            out_channels=4,
            text_embed_dim=32,
            time_embed_dim=8,
            condition_dim=2,
            pos_embed_max_size=8,
            sample_size=8,
        ),
    )
    pipe = CogView3PlusPipeline(
        transformer=transformer,
        vae=kl_vae(seed + 1),
        scheduler=CogVideoXDDIMScheduler(),
        text_encoder=tiny_t5(seed + 2),
        tokenizer=char_tokenizer(),
    )
    return pipe, dict(IMAGE_CALL, guidance_scale=7.0, max_sequence_length=48)


def chroma(seed: int = 0, cls_name: str = "ChromaPipeline"):
    transformer = seeded(
        seed,
        lambda: ChromaTransformer2DModel(
            patch_size=1,
            in_channels=16,
            num_layers=2,
            num_single_layers=2,
            attention_head_dim=16,
            num_attention_heads=2,
            joint_attention_dim=32,
            axes_dims_rope=[4, 4, 8],
            approximator_hidden_dim=32,
            approximator_layers=1,
            approximator_num_channels=16,
        ),
    )
    vae = kl_vae(seed + 1, latent_channels=4, use_quant_conv=False, use_post_quant_conv=False)
    pipe = getattr(diffusers, cls_name)(
        transformer=transformer,
        vae=vae,
        scheduler=FlowMatchEulerDiscreteScheduler(),
        text_encoder=tiny_t5(seed + 2),
        tokenizer=char_tokenizer(),
        image_encoder=None,
        feature_extractor=None,
    )
    return pipe, dict(IMAGE_CALL, guidance_scale=5.0, max_sequence_length=48)


def lumina2(seed: int = 0):
    transformer = seeded(
        seed,
        lambda: Lumina2Transformer2DModel(
            sample_size=4,
            patch_size=2,
            in_channels=4,
            hidden_size=32,
            num_layers=2,
            num_refiner_layers=1,
            num_attention_heads=4,
            num_kv_heads=2,
            multiple_of=16,
            ffn_dim_multiplier=None,
            norm_eps=1e-5,
            scaling_factor=1.0,
            axes_dim_rope=(4, 2, 2),
            axes_lens=(128, 128, 128),
            cap_feat_dim=32,
        ),
    )
    pipe = Lumina2Pipeline(
        transformer=transformer,
        vae=kl_vae(seed + 1),
        scheduler=FlowMatchEulerDiscreteScheduler(),
        text_encoder=tiny_gemma2(seed + 2),
        tokenizer=char_tokenizer(),
    )
    return pipe, dict(IMAGE_CALL, guidance_scale=4.0, max_sequence_length=48, system_prompt="sys")


def helios(seed: int = 0):

    transformer = seeded(
        seed,
        lambda: HeliosTransformer3DModel(
            patch_size=(1, 2, 2),
            num_attention_heads=4,
            attention_head_dim=8,
            in_channels=16,
            out_channels=16,
            text_dim=32,
            freq_dim=64,
            ffn_dim=48,
            num_layers=2,
            rope_dim=(4, 2, 2),
        ),
    )
    pipe = HeliosPipeline(
        transformer=transformer,
        vae=seeded(seed + 1, lambda: AutoencoderKLWan(**WAN_VAE)),
        scheduler=HeliosScheduler(stages=1, stage_range=[0, 1]),
        text_encoder=tiny_umt5(seed + 2),
        tokenizer=char_tokenizer(),
    )
    return pipe, dict(
        PROMPTS, height=32, width=32, num_frames=9, num_inference_steps=2, guidance_scale=5.0, max_sequence_length=48
    )


def lucy_edit(seed: int = 0):

    transformer = seeded(seed, lambda: WanTransformer3DModel(**dict(WAN_TRANSFORMERS["wan-4head"], in_channels=32)))
    pipe = LucyEditPipeline(
        transformer=transformer,
        vae=seeded(seed + 1, lambda: AutoencoderKLWan(**WAN_VAE)),
        scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0),
        text_encoder=tiny_umt5(seed + 2),
        tokenizer=char_tokenizer(),
    )
    # one video, one prompt (the pipeline conditions every prompt of a call on the same video)
    return pipe, dict(
        prompt="a cat walks on the grass",
        negative_prompt="blurry, static",
        video=test_frames(9),
        height=32,
        width=32,
        num_frames=9,
        num_inference_steps=2,
        guidance_scale=5.0,
        max_sequence_length=48,
    )


def hunyuan_dit(seed: int = 0, cls_name: str = "HunyuanDiTPipeline"):
    transformer = seeded(
        seed,
        lambda: HunyuanDiT2DModel(
            sample_size=8,
            num_layers=2,
            patch_size=2,
            attention_head_dim=8,
            num_attention_heads=4,
            in_channels=4,
            cross_attention_dim=32,
            cross_attention_dim_t5=32,
            pooled_projection_dim=16,
            hidden_size=32,
            text_len=77,
            text_len_t5=256,
            use_style_cond_and_image_meta_size=False,
        ),
    )
    bert = seeded(
        seed + 2,
        lambda: BertModel(
            BertConfig(
                hidden_size=32,
                num_hidden_layers=2,
                num_attention_heads=4,
                intermediate_size=37,
                vocab_size=128,
                max_position_embeddings=80,
                pad_token_id=0,
            ),
            add_pooling_layer=False,
        ),
    )
    mt5 = seeded(
        seed + 3,
        lambda: T5EncoderModel(
            MT5Config(
                vocab_size=128,
                d_model=32,
                d_kv=8,
                d_ff=64,
                num_layers=2,
                num_heads=4,
                pad_token_id=0,
                eos_token_id=1,
                feed_forward_proj="gated-gelu",
                dropout_rate=0.0,
            )
        ),
    )
    # its rotary grid assumes an 8x VAE: 4 blocks
    pipe = getattr(diffusers, cls_name)(
        transformer=transformer,
        vae=kl_vae(seed + 1, blocks=4),
        scheduler=DDPMScheduler(),
        text_encoder=bert,
        tokenizer=char_tokenizer(77),
        text_encoder_2=mt5,
        tokenizer_2=char_tokenizer(256),
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )
    return pipe, dict(IMAGE_CALL, height=64, width=64, guidance_scale=5.0, use_resolution_binning=False)


def cogview4(seed: int = 0):
    transformer = seeded(
        seed,
        lambda: CogView4Transformer2DModel(
            patch_size=2,
            in_channels=4,
            out_channels=4,
            num_layers=2,
            attention_head_dim=8,
            num_attention_heads=4,
            text_embed_dim=32,
            time_embed_dim=8,
            condition_dim=4,
            pos_embed_max_size=16,
            sample_size=16,
            rope_axes_dim=(4, 4),
        ),
    )
    glm = seeded(
        seed + 2,
        lambda: GlmModel(
            GlmConfig(
                hidden_size=32,
                intermediate_size=32,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=2,
                head_dim=8,
                vocab_size=128,
                max_position_embeddings=256,
                pad_token_id=0,
                eos_token_id=1,
            )
        ),
    )
    pipe = CogView4Pipeline(
        transformer=transformer,
        vae=kl_vae(seed + 1),
        text_encoder=glm,
        tokenizer=char_tokenizer(),
        scheduler=FlowMatchEulerDiscreteScheduler(
            base_shift=0.25, max_shift=0.75, base_image_seq_len=256, use_dynamic_shifting=True, time_shift_type="linear"
        ),
    )
    return pipe, dict(IMAGE_CALL, guidance_scale=5.0, max_sequence_length=48)


def cogvideox_i2v(seed: int = 0, cls_name: str = "CogVideoXImageToVideoPipeline"):
    """CogVideoX image-to-video and Fun-Control: the transformer takes the conditioning latents beside the noise."""

    # Fun-Control's loop steps like DDIM (CogVideoX's DPM scheduler needs its own step arguments)
    components = cogvideox_components("cogvideox-5b", seed, "dpm" if "Image" in cls_name else "ddim")
    components["transformer"] = seeded(
        seed, lambda: CogVideoXTransformer3DModel(**dict(COGVIDEOX_TRANSFORMERS["cogvideox-5b"], in_channels=8))
    )
    # one conditioning image or video: one prompt
    call = dict(
        prompt="a cat walks on the grass",
        negative_prompt="blurry, low quality",
        height=32,
        width=32,
        num_inference_steps=2,
        max_sequence_length=32,
    )
    if "Image" in cls_name:
        call.update(image=test_image(), num_frames=9)
    else:
        call.update(control_video=test_frames(9))
    return getattr(diffusers, cls_name)(**components), call


def skyreels_i2v(seed: int = 0, cls_name: str = "SkyReelsV2ImageToVideoPipeline"):

    components = wan_components("wan-4head", seed)
    components["scheduler"] = unipc()
    forcing = "DiffusionForcing" in cls_name
    config = dict(WAN_TRANSFORMERS["wan-4head"], in_channels=16) if forcing else WAN_I2V_TRANSFORMER
    components["transformer"] = seeded(seed, lambda: SkyReelsV2Transformer3DModel(**config))
    call = dict(
        prompt="a cat walks on the grass",
        negative_prompt="blurry, low quality",
        image=test_image(),
        height=32,
        width=32,
        num_frames=9,
        num_inference_steps=2,
        max_sequence_length=16,
    )
    if forcing:
        call.update(ar_step=1, causal_block_size=1)
    else:
        processor = getattr(transformers, "CLIPImageProcessorPil", transformers.CLIPImageProcessor)
        components["image_encoder"] = seeded(
            seed + 3, lambda: CLIPVisionModelWithProjection(CLIPVisionConfig(**CLIP_VISION))
        )
        components["image_processor"] = processor(crop_size=32, size=32)
    return getattr(diffusers, cls_name)(**components), call


def text_to_video_sd(seed: int = 0, cls_name: str = "TextToVideoSDPipeline"):
    """ModelScope text-to-video (and its video-to-video): a UNet3D with temporal attention."""

    unet = seeded(
        seed,
        lambda: UNet3DConditionModel(
            block_out_channels=(8, 16),
            layers_per_block=1,
            down_block_types=("CrossAttnDownBlock3D", "DownBlock3D"),
            up_block_types=("UpBlock3D", "CrossAttnUpBlock3D"),
            cross_attention_dim=32,
            attention_head_dim=4,
            norm_num_groups=4,
            in_channels=4,
            out_channels=4,
        ),
    )
    pipe = getattr(diffusers, cls_name)(
        vae=kl_vae(seed + 1),
        text_encoder=tiny_clip(seed + 2),
        tokenizer=char_tokenizer(77),
        unet=unet,
        scheduler=DDIMScheduler(),
    )
    if "VideoToVideo" in cls_name:  # one video, one prompt; its size is the video's
        call = dict(
            prompt="a cat walks on the grass",
            negative_prompt="blurry",
            strength=0.8,
            video=[np.asarray(frame) / 255.0 for frame in test_frames(4)],
        )
    else:
        call = dict(PROMPTS, height=32, width=32, num_frames=4)
    call.update(num_inference_steps=2, guidance_scale=7.5)
    return pipe, call


def animatediff_v2v(seed: int = 0):

    pipe, call = animatediff(seed)
    call = dict(
        call, prompt=call["prompt"][0], negative_prompt=call["negative_prompt"][0], video=test_frames(4), strength=0.8
    )
    call.pop("num_frames")
    return AnimateDiffVideoToVideoPipeline(**pipe.components), call


def _wan_like(seed, transformer_cls, config, pipeline_cls, scheduler, **components):

    transformer = seeded(seed, lambda: transformer_cls(**config))
    return pipeline_cls(
        transformer=transformer,
        vae=seeded(seed + 1, lambda: AutoencoderKLWan(**WAN_VAE)),
        scheduler=scheduler,
        text_encoder=tiny_umt5(seed + 2),
        tokenizer=char_tokenizer(),
        **components,
    )


def anyflow(seed: int = 0):
    config = dict(
        patch_size=(1, 2, 2),
        num_attention_heads=4,
        attention_head_dim=8,
        in_channels=16,
        out_channels=16,
        text_dim=32,
        freq_dim=64,
        ffn_dim=48,
        num_layers=2,
        rope_max_seq_len=32,
    )
    pipe = _wan_like(seed, AnyFlowTransformer3DModel, config, AnyFlowPipeline, FlowMapEulerDiscreteScheduler(shift=5.0))
    return pipe, dict(
        PROMPTS, height=32, width=32, num_frames=9, num_inference_steps=2, guidance_scale=5.0, max_sequence_length=48
    )


def anyflow_far(seed: int = 0):
    """AnyFlow FAR: frame-autoregressive chunks under a causal flex-attention block mask, older chunks compressed
    (4x4 patches), a KV cache across chunks; mean-velocity flow-map steps with CFG."""
    config = dict(
        patch_size=(1, 2, 2),
        compressed_patch_size=(1, 4, 4),
        full_chunk_limit=2,
        num_attention_heads=4,
        attention_head_dim=8,
        in_channels=16,
        out_channels=16,
        text_dim=32,
        freq_dim=64,
        ffn_dim=48,
        num_layers=2,
        rope_max_seq_len=32,
    )
    pipe = _wan_like(
        seed, AnyFlowFARTransformer3DModel, config, AnyFlowFARPipeline, FlowMapEulerDiscreteScheduler(shift=5.0)
    )
    # 13 frames: 4 latent frames in chunks of 1, 2 and 1 (stock's default partition is for 81 frames)
    return pipe, dict(
        PROMPTS,
        height=32,
        width=32,
        num_frames=13,
        num_inference_steps=2,
        guidance_scale=5.0,
        max_sequence_length=48,
        chunk_partition=[1, 2, 1],
    )


def chrono_edit(seed: int = 0):

    processor = getattr(transformers, "CLIPImageProcessorPil", transformers.CLIPImageProcessor)
    config = {k: v for k, v in WAN_I2V_TRANSFORMER.items() if k != "rope_max_seq_len"}
    pipe = _wan_like(
        seed,
        ChronoEditTransformer3DModel,
        dict(config, rope_temporal_skip_len=2),
        ChronoEditPipeline,
        FlowMatchEulerDiscreteScheduler(shift=5.0),
        image_encoder=seeded(seed + 3, lambda: CLIPVisionModel(CLIPVisionConfig(**CLIP_VISION))),
        image_processor=processor(crop_size=32, size=32),
    )
    return pipe, dict(
        prompt="a cat walks on the grass",
        negative_prompt="blurry, low quality",
        image=test_image(),
        height=32,
        width=32,
        num_frames=5,
        num_inference_steps=2,
        guidance_scale=5.0,
        max_sequence_length=48,
    )


def sana_video(seed: int = 0):
    transformer = seeded(
        seed,
        lambda: SanaVideoTransformer3DModel(
            in_channels=16,
            out_channels=16,
            num_attention_heads=2,
            attention_head_dim=8,
            num_layers=2,
            num_cross_attention_heads=2,
            cross_attention_head_dim=8,
            cross_attention_dim=16,
            caption_channels=32,
            sample_size=8,
            patch_size=(1, 2, 2),
            attention_bias=True,
            rope_max_seq_len=32,
        ),
    )
    with torch.no_grad():  # the ReLU linear attention's denominator kept away from 0 (see ``sana``)
        for block in transformer.transformer_blocks:
            block.attn1.to_q.bias.fill_(1.0)
            block.attn1.to_k.bias.fill_(1.0)
    pipe = SanaVideoPipeline(
        transformer=transformer,
        vae=seeded(seed + 1, lambda: AutoencoderKLWan(**WAN_VAE)),
        scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0),
        text_encoder=tiny_gemma2(seed + 2),
        tokenizer=char_tokenizer(),
    )
    return pipe, dict(
        PROMPTS,
        height=32,
        width=32,
        frames=9,
        num_inference_steps=2,
        guidance_scale=5.0,
        max_sequence_length=48,
        complex_human_instruction=None,
        use_resolution_binning=False,
    )


def hunyuan_skyreels_i2v(seed: int = 0):

    pipe, call = hunyuan_video(seed)
    components = dict(pipe.components)
    components["transformer"] = seeded(
        seed, lambda: HunyuanVideoTransformer3DModel.from_config(dict(pipe.transformer.config, in_channels=8))
    )  # the image latents beside the noise
    call = dict(call, image=test_image(16, 16), prompt=call["prompt"][0], negative_prompt=call["negative_prompt"][0])
    return HunyuanSkyreelsImageToVideoPipeline(**components), call
