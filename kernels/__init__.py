"""Attention and rotary kernels (Pallas) beside their pure-jnp reference. Imported as ``diffusers_tpu.kernels``.

Every attention kernel takes q ``[B, H, Sq, D]``, k/v ``[B, H, Skv, D]`` JAX arrays and the keyword arguments
``scale`` and ``kv_mask`` (bool ``[B, Skv]``, True = may be attended), and returns ``[B, H, Sq, D]``.
``interleaved_rotary`` (beside ``rotary_reference``) rotates q and k by Wan's interleaved rotary embedding in the
projections' layout.
"""

import importlib.machinery
import importlib.util
import os
import sys

# Reason: Python started in the repository's root (``python -m pytest``, ``python -c`` in a clone) finds this folder as
# the top-level ``kernels`` before Hugging Face's ``kernels`` package, which transformers >= 5.25 requires and imports
# ("cannot import name 'CUDAProperties' from 'kernels'"). This folder is ``diffusers_tpu.kernels`` (a wheel has no
# top-level ``kernels``): imported by the other name, it hands that name to the installed package.
# Guard: only when imported as ``kernels`` with Hugging Face's package installed (without it, transformers <= 5.24
# imports whatever ``kernels`` it finds to read a version, and gets this folder as before).
_handed_over = False
if __name__ == "kernels":
    _repository = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    _elsewhere = [entry for entry in sys.path if os.path.abspath(entry or os.curdir) != _repository]
    _spec = importlib.machinery.PathFinder.find_spec("kernels", _elsewhere)
    if _spec is not None:
        sys.modules["kernels"] = importlib.util.module_from_spec(_spec)
        _spec.loader.exec_module(sys.modules["kernels"])
        _handed_over = True
if not _handed_over:
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
