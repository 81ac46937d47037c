"""Attention kernels (Pallas) beside their pure-jnp reference. Imported as ``diffusers_tpu.kernels``.

Every kernel takes q ``[B, H, Sq, D]``, k/v ``[B, H, Skv, D]`` JAX arrays and the keyword arguments
``scale`` and ``kv_mask`` (bool ``[B, Skv]``, True = may be attended), and returns ``[B, H, Sq, D]``.
"""

from .blocks import BlockSizes, block_for, vmem_capacity
from .cudnn import cudnn_attention
from .flash import flash_attention
from .reference import dense_mask_attention, reference_attention
from .splash import SplashBlockSizes, splash_attention

__all__ = [
    "BlockSizes",
    "block_for",
    "vmem_capacity",
    "SplashBlockSizes",
    "cudnn_attention",
    "dense_mask_attention",
    "flash_attention",
    "reference_attention",
    "splash_attention",
]
