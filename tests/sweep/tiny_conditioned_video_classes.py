"""Tiny offline video pipelines that only the parity sweep builds, second part: LTX-2's distilled keyframe (DFR)
classes, HunyuanVideo image-to-video (LLaVA), SANA-WM, Kandinsky 6 SR and Cosmos 3 omni; each ``(pipe, call
arguments)``, 2 layers, 2+ heads."""

from __future__ import annotations

import diffusers
import torch
import transformers
from diffusers import LTX2DFRPipeline, LTXEulerAncestralRFScheduler
from diffusers.pipelines.ltx2.latent_upsampler import LTX2LatentUpsamplerModel

from diffusers_tpu.testing.tiny import WAN22_VAE, char_tokenizer
from diffusers_tpu.testing.tiny_families import pipeline, test_frames
from diffusers_tpu.testing.tiny_hunyuan import hunyuan_video
from diffusers_tpu.testing.tiny_parts import PROMPTS, fit, seeded, test_image, tiny_gemma2

LTX2_DFR_CALL = dict(
    prompt=PROMPTS["prompt"],
    height=32,
    width=32,
    num_frames=9,
    frame_rate=25.0,
    sigmas=[1.0, 0.9, 0.6],
    max_sequence_length=48,
)


def _ltx2_with_keyframes(seed: int):
    """LTX-2's tiny components with a transformer that marks keyframe tokens (``use_keyframes_abs_pos_embedding``,
    LTX-2.5): DFR refuses one without. The marker is zeros at initialisation; drawn here, as a trained one is."""

    pipe, _ = pipeline("ltx2", seed)
    transformer = seeded(
        seed,
        lambda: diffusers.LTX2VideoTransformer3DModel.from_config(
            pipe.transformer.config, use_keyframes_abs_pos_embedding=True
        ),
    ).eval()
    with torch.no_grad():
        transformer.keyframes_abs_pos_embedding.copy_(
            torch.randn(transformer.keyframes_abs_pos_embedding.shape, generator=torch.Generator().manual_seed(seed))
        )
    return dict(pipe.components, transformer=transformer)


def ltx2_dfr(seed: int = 0):
    """LTX-2 DFR (distilled, no guidance): one pass over a canvas padded to whole keyframe segments, a generated
    keyframe slot per segment end beside the video tokens, joint audio; a short distilled schedule."""
    return diffusers.LTX2DFRPipeline(**_ltx2_with_keyframes(seed)), dict(LTX2_DFR_CALL)


def ltx2_dfr_temporal_refine(seed: int = 0):
    """LTX-2 DFR's temporal refine round on the output of a DFR pass (run here on torch, as a user composes them):
    its canvas latents upsampled in time by the latent upsampler, re-denoised with the pass's keyframes and audio."""
    parts = _ltx2_with_keyframes(seed)
    with torch.no_grad():
        first = LTX2DFRPipeline(**parts)(
            **LTX2_DFR_CALL, output_type="latent", generator=torch.Generator().manual_seed(seed)
        )
    upsampler = seeded(
        seed + 12,
        lambda: LTX2LatentUpsamplerModel(  # GroupNorm(32, mid_channels)
            in_channels=parts["transformer"].config.in_channels,
            mid_channels=32,
            num_blocks_per_stage=1,
            dims=3,
            spatial_upsample=False,
            temporal_upsample=True,
        ),
    ).eval()
    parts = dict(parts, scheduler=LTXEulerAncestralRFScheduler(), temporal_latent_upsampler=upsampler)
    call = dict(
        LTX2_DFR_CALL,
        latents=first.frames,
        keyframes_latents=first.keyframes,
        keyframe_positions=first.keyframe_positions,
        audio_latents=first.audio,
        sigmas=[0.9, 0.6],
    )
    return fit("LTX2DFRTemporalRefinePipeline", parts, call)


HEADER_TOKENS = ("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<image>")


def hunyuan_video_i2v(seed: int = 0):
    """HunyuanVideo image-to-video: a LLaVA text encoder (CLIP vision tower, 4 image tokens of a 28-px image, into a
    Llama) reads the image beside the prompt through stock's chat template (its header tokens added to the
    character tokenizer, a one-letter system part); the image's latents concatenated to the noise
    (``latent_concat``); real CFG with a negative prompt. One prompt: stock pairs one image with every prompt."""

    base, call = hunyuan_video(seed)
    tokenizer = char_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": list(HEADER_TOKENS)})
    start, end, eot, image = HEADER_TOKENS
    encoder = seeded(
        seed + 2,
        lambda: transformers.LlavaForConditionalGeneration(
            transformers.LlavaConfig(
                vision_config=transformers.CLIPVisionConfig(
                    hidden_size=16,
                    intermediate_size=32,
                    num_hidden_layers=2,
                    num_attention_heads=2,
                    image_size=28,
                    patch_size=14,
                ),
                text_config=transformers.LlamaConfig(
                    hidden_size=16,
                    intermediate_size=37,
                    num_attention_heads=4,
                    num_key_value_heads=2,
                    num_hidden_layers=3,
                    vocab_size=len(tokenizer),
                    pad_token_id=0,
                    eos_token_id=1,
                    bos_token_id=None,
                ),
                image_token_index=tokenizer.convert_tokens_to_ids(image),
                pad_token_id=0,
                vision_feature_select_strategy="default",
                vision_feature_layer=-2,
            )
        ).eval(),
    )
    transformer = seeded(
        seed,
        lambda: diffusers.HunyuanVideoTransformer3DModel.from_config(
            base.transformer.config, in_channels=2 * 4 + 1, image_condition_type="latent_concat"
        ),
    ).eval()
    pipe = diffusers.HunyuanVideoImageToVideoPipeline(
        transformer=transformer,
        vae=base.vae,
        scheduler=base.scheduler,
        text_encoder=encoder,
        tokenizer=tokenizer,
        text_encoder_2=base.text_encoder_2,
        tokenizer_2=base.tokenizer_2,
        image_processor=transformers.CLIPImageProcessor(crop_size=28, size=28),
    )
    # stock's template, shortened: the image token at 3, the user prompt from 9, 4 tokens before the assistant part
    template = dict(
        template=f"{start}s{end}{image}d{eot}{start}u{end}{{}}{eot}{start}a{end}",
        crop_start=9,
        image_emb_start=3,
        image_emb_end=3 + 4,
        image_emb_len=4,
    )
    return pipe, dict(
        call,
        prompt=PROMPTS["prompt"][1],
        negative_prompt=PROMPTS["negative_prompt"][0],
        image=test_image(16, 16, seed + 4),
        prompt_template=template,
    )


def sana_wm(seed: int = 0):
    """SANA-WM camera-controlled image-to-video: a Gemma 2 encoder behind a short chi-prompt (stock's is ~1,000
    characters), the gated-delta-net linear-attention transformer with a softmax block every second layer and
    chunked Plucker camera rays (6 x the VAE's temporal stride channels) from an action string; LTX-2's VAE; CFG."""

    vae = pipeline("ltx2", seed)[0].vae
    transformer = seeded(
        seed,
        lambda: diffusers.SanaWMTransformer3DModel(
            in_channels=vae.config.latent_channels,
            num_layers=2,
            hidden_size=64,
            num_attention_heads=2,
            linear_head_dim=32,
            softmax_every_n=2,
            caption_channels=32,
            chunk_plucker_post_attn_blocks=2,
            chunk_plucker_channels=6 * vae.temporal_compression_ratio,
            image_size=32,
            mixed_precision="fp32",
        ),
    ).eval()
    pipe = diffusers.SanaWMPipeline(
        tokenizer=char_tokenizer(),
        text_encoder=tiny_gemma2(seed + 2),
        vae=vae,
        transformer=transformer,
        scheduler=diffusers.FlowMatchEulerDiscreteScheduler(),
    )
    return pipe, dict(
        image=test_image(32, 32, seed + 4),
        prompt=PROMPTS["prompt"][1],
        action="w-4,a-4",
        intrinsics=[30.0, 30.0, 16.0, 16.0],
        height=32,
        width=32,
        num_inference_steps=2,
        guidance_scale=4.0,
        negative_prompt="blurry",
        max_sequence_length=32,
        chi_prompt=["Describe: "],
    )


def kandinsky6_sr(seed: int = 0):
    """Kandinsky 6 video super-resolution (x2): the K-VAE (4x spatial here) encodes the low-resolution video, the SR
    transformer refines tiles of the trained size (one 64-px tile here) under NABLA attention (a block mask chosen
    from the queries' and keys' block means beside a sliding-tile prior: flex attention), Hann-blended."""

    vae = seeded(
        seed + 1,
        lambda: diffusers.Kandinsky6SRVAE(
            latent_channels=4,
            encoder_block_out_channels=(8, 8, 8),
            decoder_block_out_channels=(8, 8, 8),
            layers_per_block=1,
            temporal_compression_ratio=4,
        ),
    ).eval()
    transformer = seeded(
        seed,
        lambda: diffusers.Kandinsky6SRTransformer3DModel(
            in_visual_dim=4,
            out_visual_dim=4,
            time_dim=16,
            model_dim=32,
            ff_dim=64,
            num_visual_blocks=2,
            axes_dims=(4, 6, 6),
            nabla_window=(3, 3, 3),
            tile_sizes=((64, 64),),
        ),
    ).eval()
    pipe = diffusers.Kandinsky6SRPipeline(
        transformer=transformer, vae=vae, scheduler=diffusers.FlowMatchEulerDiscreteScheduler()
    )
    return pipe, dict(video=test_frames(5, seed=seed + 3), resolution_scale=2, num_inference_steps=2)


def cosmos3_omni(seed: int = 0):
    """Cosmos 3 omni text-to-video: one Qwen-style decoder reads the prompt's tokens and denoises Wan 2.2's 48-channel
    latents in the same sequence (3-D mRoPE, separate text and generation weights per layer); the character
    tokenizer with a chat template and the ``<|vision_start|>`` token; CFG with a negative prompt (stock's
    resolution and duration templates on, its long system prompt off); no safety checker."""

    tokenizer = char_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|vision_start|>"]})
    tokenizer.chat_template = "{% for m in messages %}<{{ m['content'] }}>{% endfor %}"
    transformer = seeded(
        seed,
        lambda: diffusers.Cosmos3OmniTransformer(
            head_dim=16,
            hidden_size=32,
            intermediate_size=64,
            latent_channel=48,
            latent_patch_size=2,
            num_attention_heads=2,
            num_hidden_layers=2,
            num_key_value_heads=1,
            patch_latent_dim=48 * 4,
            vocab_size=len(tokenizer),
            rope_axes_dim=(4, 2, 2),
        ),
    ).eval()
    scheduler = diffusers.UniPCMultistepScheduler(
        flow_shift=5.0, use_flow_sigmas=True, prediction_type="flow_prediction"
    )
    pipe = diffusers.Cosmos3OmniPipeline(
        transformer=transformer,
        text_tokenizer=tokenizer,
        vae=seeded(seed + 1, lambda: diffusers.AutoencoderKLWan(**WAN22_VAE)).eval(),
        scheduler=scheduler,
        enable_safety_checker=False,
    )
    return pipe, dict(
        prompt=PROMPTS["prompt"][1],
        negative_prompt=PROMPTS["negative_prompt"][0],
        num_frames=5,
        height=32,
        width=32,
        num_inference_steps=2,
        guidance_scale=4.0,
        use_system_prompt=False,
    )


RECIPES = {
    "LTX2DFRPipeline": ltx2_dfr,
    "LTX2DFRTemporalRefinePipeline": ltx2_dfr_temporal_refine,
    "HunyuanVideoImageToVideoPipeline": hunyuan_video_i2v,
    "SanaWMPipeline": sana_wm,
    "Kandinsky6SRPipeline": kandinsky6_sr,
    "Cosmos3OmniPipeline": cosmos3_omni,
}
