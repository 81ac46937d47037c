"""Attention and rotary kernels (Pallas) beside their pure-jnp reference. Imported as ``diffusers_tpu.kernels``.

Every attention kernel takes q ``[B, H, Sq, D]``, k/v ``[B, H, Skv, D]`` JAX arrays and the keyword arguments
``scale`` and ``kv_mask`` (bool ``[B, Skv]``, True = may be attended), and returns ``[B, H, Sq, D]``.
``interleaved_rotary`` (beside ``rotary_reference``) rotates q and k by Wan's interleaved rotary embedding in the
projections' layout.
"""

from .blocks import BlockSizes, block_for, vmem_capacity
from .cudnn import cudnn_attention
from .flash import flash_attention
from .reference import dense_mask_attention, reference_attention
from .rotary import interleaved_rotary, rotary_reference
from .splash import SplashBlockSizes, splash_attention

__all__ = [
    "BlockSizes",
    "block_for",
    "vmem_capacity",
    "SplashBlockSizes",
    "cudnn_attention",
    "dense_mask_attention",
    "flash_attention",
    "interleaved_rotary",
    "reference_attention",
    "rotary_reference",
    "splash_attention",
]
