"""The demo model: a small trained Wan (stock ``WanPipeline``) that draws "a red square moves left" and the like.

``diffusers-tpu generate`` uses it by default (``--model demo``). It was trained on the CPU by ``demo.train`` (a
3.8M-parameter ``WanTransformer3DModel``, flow matching on clips ``demo.scenes`` renders); its VAE and text encoder
are built, not trained (``demo.build``). ``demo.evaluate`` measures how well it follows prompts with
``scenes.analyse``. The weights ship with the package (``demo/model``, safetensors, 8 MB).

A layer of its own below ``commands`` (whose ``--model demo`` loads it): may import the public API, ``interop``,
``runtime`` and ``families``; never ``testing`` or ``commands``.
"""

from __future__ import annotations

import os

import diffusers
import torch

from .scenes import DEFAULT_PROMPT  # noqa: F401

MODEL_DIR = os.path.join(os.path.dirname(__file__), "model")
NAME = "demo"
# The size it was trained at (64x64 pixels, 9 frames = 5 latent frames = one temporal patch), its sampler's steps
# and guidance, and the text length it was trained with: 16 tokens (captions are 6), not Wan's default 512. The
# empty negative prompt is the one it learned for classifier-free guidance. Call it with these: ``pipe(prompt,
# **CALL)``. Guidance 2 over 30 steps: a stronger push (Wan's usual 5) overshoots this small model into speckle around
# the shape (clean background 81% of pixels at 5, 95% at 2, over 216 videos), and 30 steps draw the shape a little more
# often than 20; colour and direction as good (BENCHMARKS.md "Demo model").
CALL = dict(
    height=64,
    width=64,
    num_frames=9,
    num_inference_steps=30,
    guidance_scale=2.0,
    negative_prompt="",
    max_sequence_length=16,
)


def load_pipeline(folder: str = MODEL_DIR):
    """The shipped demo ``diffusers.WanPipeline`` on the CPU (float32)."""
    if not os.path.isfile(os.path.join(folder, "model_index.json")):
        raise FileNotFoundError(
            f"The demo model is missing from {folder}: reinstall diffusers_tpu, or rebuild it with "
            f"`python -m diffusers_tpu.demo.train --output {folder}`."
        )

    # the transformer is stored in float16 (``demo.train.save``); the pipeline runs in float32
    return diffusers.WanPipeline.from_pretrained(folder, use_safetensors=True, dtype=torch.float32)
