"""UNet pipelines: Stable Diffusion 1.x/2.x, SDXL, Stable Video Diffusion, AnimateDiff and the pipelines built on
them (img2img, inpaint, ControlNet, ...) — any pipeline whose denoiser is a diffusers ``unet``.

- **Compiled**: the UNet's forward (one program per input shape; the ControlNet's and the image encoder's forward
  too, as every other module), the VAE's ``decoder`` / ``encoder`` (SVD's temporal decoder included).
- **CFG**: these pipelines batch the guidance pair themselves (``torch.cat([latents] * 2)``); the UNet's inputs
  are placed batch-over-``dp``, so the pair splits over dp with no family code.
- **Sharding**: the generic path's Megatron rules find every cross/self-attention (``to_q``/``to_k``/``to_v``
  column-, ``to_out.0`` row-parallel) and ``FeedForward`` inside the UNet's transformer blocks (AnimateDiff's motion
  modules and SVD's temporal blocks included); convolutions, norms and embeddings stay replicated: a UNet's
  weights are small (SDXL's 2.6 GB in bf16) and its convolutions would pay a halo exchange per layer. Activations:
  every down/mid/up block's input batch over dp; the spatial transformers' tokens over sp.
- **Attention** goes through the project's kernel at the SDPA seam (``AttnProcessor2_0``), as for the transformers.
"""

from __future__ import annotations

import dataclasses
import inspect
import math

import torch
from diffusers import ModelMixin

from ..runtime.registry import Family, Planning, register_fallback, vae_methods
from . import generic

# Block inputs are NCHW (NCFHW for AnimateDiff and SVD's [B*F, C, H, W]): only the batch splits.
_BLOCKS = (r"^(down_blocks\.\d+|mid_block|up_blocks\.\d+)$", ("dp",))
# A spatial transformer's blocks see [B, H*W, C] tokens: batch over dp, tokens over sp. Motion modules (tokens are
# frames, too few to split) are not matched.
_TOKENS = (r"\.attentions\.\d+\.transformer_blocks\.\d+$", ("dp", "sp", None))


def has_unet(pipe) -> bool:
    return isinstance(getattr(pipe, "unet", None), ModelMixin)


def family_for(pipe) -> Family | None:
    """The UNet family for ``pipe``, or None when it has no diffusers ``unet``."""
    if not has_unet(pipe) or generic.denoiser_names(pipe):
        return None
    vae = getattr(pipe, "vae", None)
    image_vae = type(vae).__name__ == "AutoencoderKL" and not hasattr(pipe, "motion_adapter")
    return dataclasses.replace(
        UNET,
        pipelines=(type(pipe),),
        vae_methods=vae_methods(vae),
        decode_latents=decode_latents if image_vae else None,
        planning=Planning(call=plan_call),
    )


def decode_latents(pipe, latents, num_frames: int):
    """Stock's tail after the loop for an image pipeline (SD, SDXL): unscale the latents and decode them (what
    ``plan`` compiles for the VAE; staged runs do not use it yet)."""
    vae = pipe.vae
    mean, std = getattr(vae.config, "latents_mean", None), getattr(vae.config, "latents_std", None)
    latents = latents.to(vae.dtype)
    if mean is not None and std is not None:  # SDXL checkpoints that record their latents' statistics
        shape = (1, len(mean), 1, 1)
        latents = latents * torch.tensor(std).view(shape) / vae.config.scaling_factor + torch.tensor(mean).view(shape)
    else:
        latents = latents / vae.config.scaling_factor
    return vae.decode(latents, return_dict=False)[0]


def plan_call(pipe, size: dict, tokens: int | None, dtype) -> dict:
    """``plan``'s call of an SD/SDXL pipeline: zero text embeddings of the UNet's cross-attention width, as long as
    its CLIP tokenizer pads every prompt (77; ``tokens`` does not apply), SDXL's pooled embeddings too."""
    tokens = getattr(getattr(pipe, "tokenizer", None), "model_max_length", None) or 77
    text = torch.zeros(1, tokens, pipe.unet.config.cross_attention_dim, dtype=dtype)
    call = dict(
        height=size["height"],
        width=size["width"],
        guidance_scale=size["guidance_scale"],
        prompt_embeds=text,
        negative_prompt_embeds=text,
        num_inference_steps=2,
    )
    encoder = getattr(pipe, "text_encoder_2", None)
    if "pooled_prompt_embeds" in inspect.signature(type(pipe).__call__).parameters:
        pooled = torch.zeros(1, encoder.config.projection_dim, dtype=dtype)
        call.update(pooled_prompt_embeds=pooled, negative_pooled_prompt_embeds=pooled)
    return call


def num_heads(pipe) -> int | None:
    """The head count tp must divide: the gcd over the UNet's attention modules (SDXL: 5, 10, 20 -> 5)."""
    heads = [m.heads for m in pipe.unet.modules() if generic.is_attention(m)]
    return math.gcd(*heads) if heads else None


UNET = Family(
    name="unet",
    pipelines=(),
    denoisers=("unet",),
    num_heads=num_heads,
    rules_for=generic.infer_rules,
    activation_rules=(_BLOCKS, _TOKENS),
)
register_fallback(family_for)
