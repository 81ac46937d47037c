"""Tiny offline pipelines that only the parity sweep builds whose Qwen2.5-VL text encoder sits behind Qwen2-VL's
processor: Qwen-Image's edit classes (the encoder reads the input image beside the instruction: the processor
expands the template's image token into one token per merged 28x28 patch) and Kandinsky 5 and 6 (text only through
the processor): each ``(pipe, call arguments)``."""

from __future__ import annotations

import functools
import importlib

import diffusers
import torch
import transformers
from diffusers.pipelines.kandinsky6 import pipeline_kandinsky6_ti2va

from diffusers_tpu.testing import tiny_hunyuan, tiny_images, tiny_parts
from diffusers_tpu.testing.tiny import WAN_VAE, char_tokenizer
from diffusers_tpu.testing.tiny_parts import PassThroughGuardrail, fit, kl_vae, seeded, test_image, test_mask, tiny_clip

VISION_TOKENS = ("<|image_pad|>", "<|vision_start|>", "<|vision_end|>")


def _processor(tokenizer):
    return tiny_parts.vl_processor(transformers.Qwen2VLProcessor, tokenizer, VISION_TOKENS)


def _small_reference_images():
    """Stock sizes a reference image to a fixed area whatever the output's size (1024² for the VAE, 384² for the VL
    encoder): 4,096 image tokens, beyond a CPU sweep. The recipe caps that area at 64² in the edit modules (test
    harness only, for stock and JAX alike; the pipelines' code is otherwise stock's)."""
    for name in ("pipeline_qwenimage_edit", "pipeline_qwenimage_edit_inpaint", "pipeline_qwenimage_edit_plus"):
        module = importlib.import_module(f"diffusers.pipelines.qwenimage.{name}")
        stock = module.calculate_dimensions
        if not getattr(stock, "_tiny_sweep", False):
            capped = functools.partial(lambda area, ratio, stock: stock(min(area, 64 * 64), ratio), stock=stock)
            capped._tiny_sweep = True
            module.calculate_dimensions = capped


def _vl_encoder(qwen_pipe, seed):
    """Qwen-Image's tiny Qwen2.5-VL encoder, rebuilt with the processor's vision token ids, and the processor."""
    processor = _processor(qwen_pipe.tokenizer)
    ids = {
        name: qwen_pipe.tokenizer.convert_tokens_to_ids(token)
        for name, token in zip(("image_token_id", "vision_start_token_id", "vision_end_token_id"), VISION_TOKENS)
    }
    encoder = qwen_pipe.text_encoder
    config = dict(encoder.config.to_dict(), **ids)
    torch.manual_seed(seed + 2)
    return type(encoder)(type(encoder.config).from_dict(config)).eval(), processor


def qwen_image_edit(seed: int = 0, cls_name: str = "QwenImageEditPipeline"):
    """Qwen-Image edit, edit-plus (several reference images) and edit-inpaint: the reference image's latents join
    the noise tokens; the VL encoder sees it too. One prompt a call (stock's processor pairs one image with every
    prompt's image token)."""
    _small_reference_images()
    pipe, call = tiny_images.qwen_image(seed)
    encoder, processor = _vl_encoder(pipe, seed)
    parts = dict(pipe.components, text_encoder=encoder, processor=processor)
    image = test_image(seed=seed + 3)
    call = dict(
        call,
        image=[image, test_image(seed=seed + 4)] if cls_name == "QwenImageEditPlusPipeline" else image,
        prompt=call["prompt"][1],
        negative_prompt=call["negative_prompt"][0],
    )
    if "Inpaint" in cls_name:
        call.update(mask_image=test_mask(), strength=0.8)
    built, call = fit(cls_name, parts, call)
    # the template's shape with a short system part (``tiny_images.qwen_image``): the first 3 tokens dropped
    built.prompt_template_encode = "<s>" + "".join((VISION_TOKENS[1], VISION_TOKENS[0], VISION_TOKENS[2])) + "{}<e>"
    built.prompt_template_encode_start_idx = 3
    if cls_name == "QwenImageEditPlusPipeline":  # it writes "Picture i: <vision tokens>" per image itself
        built.prompt_template_encode = "<s>{}<e>"
    return built, call


def kandinsky5(seed: int = 0, cls_name: str = "Kandinsky5T2VPipeline"):
    """Kandinsky 5: Qwen2.5-VL states (through its processor) and CLIP's pooled embedding condition the Kandinsky 5
    transformer (text blocks, then visual blocks); video with HunyuanVideo's VAE, images with Flux's; image-to-video
    and image-to-image add the image's latents as a visual condition; CFG with a negative prompt."""
    image = "T2I" in cls_name or "I2I" in cls_name  # Flux's VAE (16 channels), else HunyuanVideo's
    qwen, _ = tiny_images.qwen_image(seed)
    encoder, processor = _vl_encoder(qwen, seed)
    channels = 16 if image else 4
    transformer = seeded(
        seed,
        lambda: diffusers.Kandinsky5Transformer3DModel(
            in_visual_dim=channels,
            in_text_dim=16,
            in_text_dim2=32,
            time_dim=16,
            out_visual_dim=channels,
            patch_size=(1, 2, 2),
            model_dim=32,
            ff_dim=64,
            num_text_blocks=2,
            num_visual_blocks=2,
            axes_dims=(4, 6, 6),
            visual_cond="I2V" in cls_name or "I2I" in cls_name,
        ),
    )
    vae = kl_vae(seed + 1, latent_channels=16, blocks=4) if image else tiny_hunyuan.hunyuan_video(seed)[0].vae  # 8x
    parts = dict(
        transformer=transformer,
        vae=vae,
        text_encoder=encoder,
        tokenizer=processor,
        text_encoder_2=tiny_clip(seed + 3),
        tokenizer_2=char_tokenizer(77),
        scheduler=diffusers.FlowMatchEulerDiscreteScheduler(shift=5.0),
    )
    call = dict(
        tiny_parts.PROMPTS,
        height=64,
        width=64,
        num_frames=9,
        num_inference_steps=2,
        guidance_scale=4.0,
        max_sequence_length=32,
    )
    if "I2V" in cls_name or "I2I" in cls_name:
        call.update(image=test_image(64, 64, seed + 4))
    if "I2V" in cls_name:  # stock renormalizes the first 4 latent frames against the next ones: 6 latent frames
        call.update(num_frames=21)
    if cls_name == "Kandinsky5I2IPipeline":  # one image, one prompt, untruncated: the VL encoder reads both
        call.update(prompt=call["prompt"][1], negative_prompt=call["negative_prompt"][0], max_sequence_length=128)
    built, call = fit(cls_name, parts, call)
    # stock's template with a short system part ("<s>" dropped), as for Qwen-Image; I2I's asks for the image too
    vision = (
        "".join((VISION_TOKENS[1], VISION_TOKENS[0], VISION_TOKENS[2])) if cls_name == "Kandinsky5I2IPipeline" else ""
    )
    built.prompt_template, built.prompt_template_encode_start_idx = "<s>{}" + vision + "<e>", 3
    if image:  # stock snaps images to its 1024-px sizes (4,096 tokens here): the recipe's own size instead
        built.resolutions = [(64, 64)]
    return built, call


def cosmos25(seed: int = 0, cls_name: str = "Cosmos2_5_PredictBasePipeline"):
    """Cosmos 2.5 predict: every Qwen2.5-VL layer's normalized states side by side (2 x 16 features) projected into
    the Cosmos transformer's cross-attention; Wan's VAE; UniPC; text-to-world and, given a first frame,
    image-to-world; the guardrail's pass-through stand-in."""

    qwen, _ = tiny_images.qwen_image(seed)
    tokenizer = char_tokenizer()  # the chat template of Cosmos' conversations (content as a list of text parts)
    tokenizer.chat_template = (
        "{% for m in messages %}<{% for c in m['content'] %}{{ c['text'] }}{% endfor %}>{% endfor %}"
    )
    transformer = seeded(
        seed,
        lambda: diffusers.CosmosTransformer3DModel(
            in_channels=17,
            out_channels=16,
            num_attention_heads=2,
            attention_head_dim=16,
            num_layers=2,
            mlp_ratio=2,
            text_embed_dim=32,
            adaln_lora_dim=4,
            max_size=(4, 32, 32),
            patch_size=(1, 2, 2),
            rope_scale=(1.0, 1.0, 1.0),
            concat_padding_mask=False,
            extra_pos_embed_type=None,
            use_crossattn_projection=True,
            crossattn_proj_in_channels=32,
            encoder_hidden_states_channels=32,
        ),
    )
    parts = dict(
        text_encoder=qwen.text_encoder,
        tokenizer=tokenizer,
        transformer=transformer,
        vae=seeded(seed + 1, lambda: diffusers.AutoencoderKLWan(**WAN_VAE)),
        scheduler=diffusers.UniPCMultistepScheduler(
            flow_shift=5.0, use_flow_sigmas=True, prediction_type="flow_prediction"
        ),
        safety_checker=PassThroughGuardrail(),
    )
    call = dict(
        prompt="a cat walks on the grass",
        negative_prompt="blurry, low quality",
        height=32,
        width=32,
        num_frames=5,
        num_inference_steps=2,
        guidance_scale=7.0,
        max_sequence_length=48,
    )
    return fit(cls_name, parts, call)


def cosmos25_transfer(seed: int = 0):
    """Cosmos 2.5 transfer: the predict recipe's parts with a ControlNet (its control branch reads the control
    video's latents, the condition mask and the padding mask) feeding every transformer block; an edge-like control
    video of 5 frames. Stock's ControlNet resizes the padding mask with torchvision, which this environment lacks
    (its wheels here need a CUDA build of torch 2.14)."""
    pipe, call = cosmos25(seed)
    config = dict(
        num_attention_heads=2,
        attention_head_dim=16,
        mlp_ratio=2,
        text_embed_dim=32,
        adaln_lora_dim=4,
        max_size=(4, 32, 32),
        patch_size=(1, 2, 2),
        rope_scale=(1.0, 1.0, 1.0),
    )
    transformer = seeded(
        seed,
        lambda: diffusers.CosmosTransformer3DModel(
            in_channels=17,
            out_channels=16,
            num_layers=2,
            concat_padding_mask=False,
            extra_pos_embed_type=None,
            use_crossattn_projection=True,
            crossattn_proj_in_channels=32,
            encoder_hidden_states_channels=32,
            controlnet_block_every_n=1,
            **config,
        ),
    )
    controlnet = seeded(
        seed + 5,
        lambda: diffusers.CosmosControlNetModel(
            n_controlnet_blocks=2,
            in_channels=16 + 2,
            latent_channels=16 + 2,
            model_channels=32,
            use_crossattn_projection=True,
            crossattn_proj_in_channels=32,
            encoder_hidden_states_channels=32,
            **config,
        ),
    )
    parts = dict(pipe.components, transformer=transformer, controlnet=controlnet)
    controls = [test_image(32, 32, seed + 6 + frame) for frame in range(5)]
    return fit("Cosmos2_5_TransferPipeline", parts, dict(call, controls=controls, num_frames_per_chunk=5))


def _short_kandinsky6_template():
    """Stock wraps each prompt in a 7-line system template and crops its first 129 Qwen tokens (module constants):
    with the character tokenizer that is ~700 tokens a prompt. The recipe sets a short template and crop in the
    module (test harness only, for stock and JAX alike)."""
    pipeline_kandinsky6_ti2va._PROMPT_TEMPLATE, pipeline_kandinsky6_ti2va._QWEN_CROP_START = "<s>{}<e>", 3


def kandinsky6(seed: int = 0):
    """Kandinsky 6 text/image-to-video: Qwen2.5-VL states (through its processor) and CLIP's pooled embedding into
    the fused video-audio transformer; the image's latents as the first frame's visual condition; HunyuanVideo's
    VAE; CFG with a negative prompt. Video only (``sample_audio=False``): the MMAudio VAE and vocoder are left out."""
    _short_kandinsky6_template()
    encoder, processor = _vl_encoder(tiny_images.qwen_image(seed)[0], seed)
    transformer = seeded(
        seed,
        lambda: diffusers.Kandinsky6Transformer3DModel(
            in_visual_dim=4,
            out_visual_dim=4,
            in_text_dim=16,
            in_text_dim2=32,
            time_dim=16,
            patch_size=(1, 2, 2),
            model_dim=32,
            ff_dim=64,
            num_text_blocks=2,
            num_visual_blocks=2,
            axes_dims=(4, 6, 6),
            visual_cond=True,
            in_audio_dim=4,
            out_audio_dim=4,
            visual_token_type_num_embeddings=2,
        ),
    )
    parts = dict(
        transformer=transformer,
        vae=tiny_hunyuan.hunyuan_video(seed)[0].vae,
        text_encoder=encoder,
        tokenizer=processor,
        text_encoder_2=tiny_clip(seed + 3),
        tokenizer_2=char_tokenizer(77),
        scheduler=diffusers.FlowMatchEulerDiscreteScheduler(shift=5.0),
    )
    images = [test_image(64, 64, seed + 4), test_image(64, 64, seed + 5)]  # one a prompt
    call = dict(
        tiny_parts.PROMPTS,
        image=images,
        height=64,
        width=64,
        num_frames=9,
        num_inference_steps=2,
        guidance_scale=4.0,
        max_sequence_length=32,
        sample_audio=False,
    )
    return fit("Kandinsky6TI2VAPipeline", parts, call)
