"""diffusers_tpu: stock HuggingFace diffusers pipelines on TPU (or any JAX platform) with ``pipe.to("tpu")``.

    import diffusers, diffusers_tpu
    pipe = diffusers.WanPipeline.from_pretrained(path)
    pipe.to("tpu")              # or "jax": JAX's default platform, same code path
    video = pipe(prompt).frames[0]
    pipe.to("cpu")              # back to plain torch

The package is layered; each layer imports only those below it (``tests/test_layers.py`` checks it):

    kernels     the attention kernels (top-level ``kernels/``, imported as ``diffusers_tpu.kernels``)
    interop     torch <-> JAX: torchax compat, devices and mesh, sharding, compiled methods (model-agnostic)
    runtime     the pipeline runtime: TPUConfig, attach/detach, denoiser, attention, CFG, LoRA, int8, stages
    families    one file per model family, and the generic path
    (this file) the public API
    planner     plan, real-size architectures, TPU lowering
    testing     tiny offline models (tests, notebooks, ``--model tiny:*``)
    demo        the trained demo model
    commands    the ``diffusers-tpu`` command line and measurement scripts
"""

__version__ = "0.1.0"

import importlib

from .interop import compat, distributed

compat.quiet_absent_libtpu()  # libtpu installed on a host without TPU chips: before JAX may load it
distributed.initialize_from_env()  # a multi-host run: before anything touches a JAX backend

compat.import_torchax()  # torchax must import (through its compat shim) before anything touches it

from .families import (causal_wan_pipeline, cogvideox, flux, generic, hunyuan, hunyuan_video, ltx, ltx2,  # noqa: E402,F401
                       qwenimage, wan, zimage)  # (each registers its model family; generic the fallback)
from .runtime import patches  # noqa: E402  (hooks diffusers, peft and torch.Generator)

patches.apply()

from .families.causal_wan import CausalWanTransformer3DModel  # noqa: E402
from .families.causal_wan_pipeline import CausalWanPipeline  # noqa: E402
from .families.cogvideox import CogVideoXPipeline  # noqa: E402
from .families.hunyuan import HunyuanVideo15Pipeline  # noqa: E402
from .families.wan import WanImageToVideoPipeline, WanPipeline  # noqa: E402
from .interop.sharding import sharding_of  # noqa: E402
from .runtime.attach import CallStats, stats  # noqa: E402
from .runtime.config import TPUConfig  # noqa: E402
from .runtime.loading import from_pretrained  # noqa: E402
from .runtime.registry import supported_pipelines  # noqa: E402
from .runtime.warmup import warm_up  # noqa: E402

# Module paths from before the layered layout that README and the notebooks use (``from diffusers_tpu import tiny``,
# ``diffusers_tpu.lowering.export_method``): resolved on first use, so the test models stay out of ``import``.
_MOVED = {"tiny": "testing.tiny", "stages": "runtime.stages", "lowering": "planner.lowering", "wan": "families.wan"}


def __getattr__(name: str):
    if name in _MOVED:
        return importlib.import_module(f"{__name__}.{_MOVED[name]}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["CallStats", "CausalWanPipeline", "CausalWanTransformer3DModel", "CogVideoXPipeline", "HunyuanVideo15Pipeline",
           "TPUConfig", "WanImageToVideoPipeline", "WanPipeline", "__version__", "from_pretrained", "sharding_of", "stats",
           "supported_pipelines", "warm_up"]
