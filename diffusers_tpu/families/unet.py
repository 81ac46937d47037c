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
import logging
import math

from ..runtime.registry import Family, register_fallback, register_verified_unet, vae_methods
from . import generic

logger = logging.getLogger(__name__)

# Block inputs are NCHW (NCFHW for AnimateDiff and SVD's [B*F, C, H, W]): only the batch splits.
_BLOCKS = (r"^(down_blocks\.\d+|mid_block|up_blocks\.\d+)$", ("dp",))
# A spatial transformer's blocks see [B, H*W, C] tokens: batch over dp, tokens over sp. Motion modules (tokens are
# frames, too few to split) are not matched.
_TOKENS = (r"\.attentions\.\d+\.transformer_blocks\.\d+$", ("dp", "sp", None))
_announced: set[str] = set()


def has_unet(pipe) -> bool:
    from diffusers import ModelMixin

    return isinstance(getattr(pipe, "unet", None), ModelMixin)


def family_for(pipe) -> Family | None:
    """The UNet family for ``pipe``, or None when it has no diffusers ``unet``."""
    if not has_unet(pipe) or generic.denoiser_names(pipe):
        return None
    name = type(pipe).__name__
    if name not in _announced and name not in VERIFIED:
        _announced.add(name)
        logger.warning("%s runs on diffusers_tpu's UNet path, which has not been compared with stock diffusers for "
                       "this pipeline class (verified: %s). See diffusers_tpu.supported_pipelines().", name,
                       ", ".join(sorted(VERIFIED)))
    return dataclasses.replace(UNET, pipelines=(type(pipe),), vae_methods=vae_methods(getattr(pipe, "vae", None)))


def num_heads(pipe) -> int | None:
    """The head count tp must divide: the gcd over the UNet's attention modules (SDXL: 5, 10, 20 -> 5)."""
    heads = [m.heads for m in pipe.unet.modules() if generic.is_attention(m)]
    return math.gcd(*heads) if heads else None


UNET = Family(name="unet", pipelines=(), denoisers=("unet",), num_heads=num_heads, rules_for=generic.infer_rules,
              activation_rules=(_BLOCKS, _TOKENS))
# Pipeline classes compared with stock diffusers in the test suite (tests/test_unet.py, on 1 device and the mesh).
VERIFIED = frozenset({"StableDiffusionPipeline", "StableDiffusionImg2ImgPipeline", "StableDiffusionInpaintPipeline",
                      "StableDiffusionControlNetPipeline", "StableDiffusionXLPipeline", "StableVideoDiffusionPipeline",
                      "AnimateDiffPipeline"})
register_fallback(family_for)
register_verified_unet(VERIFIED)
