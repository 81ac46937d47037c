"""Tiny offline pipelines of the newer first-class families (2+ layers, 4 heads, padded prompts of different
lengths): Wan's wider family. Built from the same pieces as ``tiny``.

LTX and LTX-2 are ``tiny_ltx``, HunyuanVideo 1.0 and 1.5 image-to-video ``tiny_hunyuan``."""

from __future__ import annotations

import numpy as np
import PIL.Image
import torch
import transformers
from diffusers import (
    AutoencoderKLWan,
    FlowMatchEulerDiscreteScheduler,
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
from transformers import (
    CLIPVisionConfig,
    CLIPVisionModel,
)

from .tiny import (
    CLIP_VISION,
    WAN_I2V_TRANSFORMER,
    WAN_TRANSFORMERS,
    WAN_VAE,
    char_tokenizer,
)
from .tiny_hunyuan import hunyuan15_i2v, hunyuan_video
from .tiny_ltx import ltx, ltx2, ltx2_i2v, ltx_i2v
from .tiny_parts import PROMPTS, test_image, tiny_umt5


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
