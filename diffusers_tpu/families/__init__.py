"""Model families: one file per family holding everything family-specific, plus the generic path.

Each family module registers a ``runtime.registry.Family`` (sharding rules, CFG batching, VAE programs, checks)
when imported; ``import diffusers_tpu`` has the registry import them all (``load_all``) the first time a pipeline's
family is looked up: they import diffusers' model classes, seconds that a script (or ``diffusers-tpu --help``) that
never moves a pipeline does not pay. ``generic`` infers a family from any transformer
pipeline's module structure; ``wan_vae`` holds the chunked Wan-VAE programs Wan, causal Wan and the generic
path's Wan-like VAEs share; ``causal_wan`` is the causal transformer model (a new ``ModelMixin``), and
``causal_wan_pipeline`` its pipeline and family.

May import: ``interop``, ``runtime`` and ``kernels``; a family may build on another family (Flux on HunyuanVideo's
helpers, LTX-2 on LTX). Never the planner, ``testing``, ``demo`` or ``commands``.
"""

import importlib

MODULES = (
    "causal_wan_pipeline",
    "cogvideox",
    "flux",
    "generic",
    "hunyuan_video",
    "hunyuan_video15",
    "ltx",
    "ltx2",
    "nucleusmoe",
    "qwenimage",
    "unet",
    "wan",
    "zimage",
)  # each registers its family when imported; generic the fallback


def load_all() -> None:
    for name in MODULES:
        importlib.import_module(f"{__name__}.{name}")
