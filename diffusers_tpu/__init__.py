"""diffusers_tpu: stock HuggingFace diffusers pipelines on TPU (or any JAX platform) with ``pipe.to("tpu")``.

    import diffusers, diffusers_tpu
    pipe = diffusers.WanPipeline.from_pretrained(path)
    pipe.to("tpu")              # or "jax": JAX's default platform, same code path
    video = pipe(prompt).frames[0]
    pipe.to("cpu")              # back to plain torch
"""

__version__ = "0.1.0"

from . import distributed

distributed.initialize_from_env()  # a multi-host run: before anything touches a JAX backend

from . import compat  # noqa: E402

compat.import_torchax()  # torchax must import (through its compat shim) before anything touches it

from . import (causal_wan_pipeline, cogvideox, flux, hunyuan, hunyuan_video, ltx, ltx2, qwenimage, wan,  # noqa: E402,F401
               zimage)  # noqa: E402,F401  (register the model families)
from . import patches  # noqa: E402  (top of the import graph: hooks diffusers, peft and torch.Generator)

patches.apply()

from .causal_wan import CausalWanTransformer3DModel  # noqa: E402
from .causal_wan_pipeline import CausalWanPipeline  # noqa: E402
from .cogvideox import CogVideoXPipeline  # noqa: E402
from .config import TPUConfig  # noqa: E402
from .families import supported_pipelines  # noqa: E402
from .hunyuan import HunyuanVideo15Pipeline  # noqa: E402
from .loading import from_pretrained  # noqa: E402,F401
from .runtime import CallStats, stats  # noqa: E402
from .sharding import sharding_of  # noqa: E402
from .wan import WanImageToVideoPipeline, WanPipeline  # noqa: E402

__all__ = ["CallStats", "CausalWanPipeline", "CausalWanTransformer3DModel", "CogVideoXPipeline", "HunyuanVideo15Pipeline", "TPUConfig", "WanImageToVideoPipeline", "WanPipeline", "__version__", "sharding_of", "stats", "supported_pipelines"]
