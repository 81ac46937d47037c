"""Tiny offline pipelines of the newer first-class families (2+ layers, 4 heads, padded prompts of different
lengths): Wan's wider family. Built from the same pieces as ``tiny``."""

from __future__ import annotations

import numpy as np
import PIL.Image
import torch

from .tiny import WAN_TRANSFORMERS, WAN_VAE, char_tokenizer, tiny_umt5

PROMPTS = dict(prompt=["a cat walks on the grass", "a red fox jumps over a sleeping dog in the snow"],
               negative_prompt=["blurry", "low quality, static, deformed"])


def _wan_parts(seed: int) -> dict:
    from diffusers import AutoencoderKLWan

    torch.manual_seed(seed + 1)
    return dict(vae=AutoencoderKLWan(**WAN_VAE).eval(), text_encoder=tiny_umt5(seed + 2), tokenizer=char_tokenizer())


def test_frames(count: int = 9, size: int = 32, seed: int = 0) -> list:
    rng = np.random.default_rng(seed)
    return [PIL.Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)) for _ in range(count)]


def _flow(shift: float = 7.0):
    from diffusers import FlowMatchEulerDiscreteScheduler

    return FlowMatchEulerDiscreteScheduler(shift=shift)


def _unipc():
    from diffusers import UniPCMultistepScheduler

    return UniPCMultistepScheduler(flow_shift=8.0, use_flow_sigmas=True, prediction_type="flow_prediction")


def wan_v2v(seed: int = 0):
    from diffusers import WanTransformer3DModel, WanVideoToVideoPipeline

    torch.manual_seed(seed)
    transformer = WanTransformer3DModel(**WAN_TRANSFORMERS["wan-4head"]).eval()
    pipe = WanVideoToVideoPipeline(transformer=transformer, scheduler=_flow(), **_wan_parts(seed))
    return pipe, dict(PROMPTS, video=test_frames(), height=32, width=32, num_inference_steps=3, strength=0.8)


def wan_vace(seed: int = 0):
    from diffusers import WanVACEPipeline, WanVACETransformer3DModel

    torch.manual_seed(seed)
    transformer = WanVACETransformer3DModel(**WAN_TRANSFORMERS["wan-4head"], vace_layers=[0, 2],
                                            vace_in_channels=96).eval()
    pipe = WanVACEPipeline(transformer=transformer, scheduler=_flow(), **_wan_parts(seed))
    mask = PIL.Image.fromarray(((np.arange(32)[None, :] > 16) * 255).astype(np.uint8).repeat(32, 0))
    # VACE takes one prompt per call (stock: "batching is not yet supported")
    return pipe, dict(prompt="a cat walks on the grass", negative_prompt="blurry, low quality", video=test_frames(),
                      mask=[mask] * 9, height=32, width=32, num_frames=9, num_inference_steps=2, max_sequence_length=16)


def skyreels_v2(seed: int = 0):
    from diffusers import SkyReelsV2Pipeline, SkyReelsV2Transformer3DModel

    torch.manual_seed(seed)
    transformer = SkyReelsV2Transformer3DModel(**WAN_TRANSFORMERS["wan-4head"]).eval()
    pipe = SkyReelsV2Pipeline(transformer=transformer, scheduler=_unipc(), **_wan_parts(seed))
    return pipe, dict(PROMPTS, height=32, width=32, num_frames=9, num_inference_steps=2, max_sequence_length=16)


def skyreels_v2_df(seed: int = 0):
    from diffusers import SkyReelsV2DiffusionForcingPipeline, SkyReelsV2Transformer3DModel

    torch.manual_seed(seed)
    transformer = SkyReelsV2Transformer3DModel(**WAN_TRANSFORMERS["wan-4head"]).eval()
    pipe = SkyReelsV2DiffusionForcingPipeline(transformer=transformer, scheduler=_unipc(), **_wan_parts(seed))
    # diffusion forcing: frames one block behind each other (ar_step), a block-causal mask per frame
    return pipe, dict(prompt="a cat walks on the grass", negative_prompt="blurry, low quality", height=32, width=32,
                      num_frames=9, num_inference_steps=2, max_sequence_length=16, ar_step=1, causal_block_size=1)


PIPELINES = {"wan-v2v": wan_v2v, "wan-vace": wan_vace, "skyreels-v2": skyreels_v2, "skyreels-v2-df": skyreels_v2_df}


def pipeline(name: str, seed: int = 0):
    """``(pipe, call arguments)`` for a tiny pipeline of a newer family."""
    if name not in PIPELINES:
        raise ValueError(f"No tiny pipeline {name!r}; choose one of {sorted(PIPELINES)}.")
    return PIPELINES[name](seed)
