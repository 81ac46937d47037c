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
import sys

from .interop import import_hooks, startup, versions

_activated = False
_deactivated = False


def activate() -> None:
    """Switch the integration on (idempotent): multi-host start-up, torchax, the patches; the families register on
    first lookup. ``import diffusers_tpu`` calls it at once when torch is already imported (any script
    holding a pipeline); otherwise (``diffusers-tpu --help``) when diffusers imports its pipelines or a name below is
    first used, so that a command can read its arguments before torch and JAX load."""
    global _activated
    if _activated:
        return
    if _deactivated:  # on again: what the import settled once
        startup.quiet_absent_libtpu()
        startup.quiet_known_noise()
    _activated = True
    from .interop import distributed

    distributed.initialize_from_env()  # a multi-host run: before anything touches a JAX backend

    from .interop import compile_accounting

    compile_accounting.count_programs()  # JAX's own count of the process's programs, from the start (``stats``)
    from . import families
    from .runtime import registry
    from .runtime.patches import entry_points

    registry.register_loader(families.load_all)
    entry_points.apply()  # torch/torchax now; DiffusionPipeline and peft when they are imported


def deactivate() -> None:
    """Undo ``activate`` and everything ``import diffusers_tpu`` changed: every pipeline on JAX goes back to the host
    (as ``pipe.to("cpu")`` does), then every patch of torch, torchax, diffusers and peft is put back as it was, last
    first, and no patch waits for a module's import any more. Stock code then runs as in a process that never
    imported ``diffusers_tpu`` (tested bit for bit); ``activate()`` switches it on again. What stays: torchax and JAX
    themselves, once imported, and JAX's compilation-cache setting."""
    global _activated, _deactivated
    if "diffusers_tpu.runtime.attach.moves" in sys.modules:
        from .runtime.attach import moves

        moves.detach_all()
    from .interop import import_hooks, patching

    import_hooks.forget_all()
    patching.undo_all()
    _activated, _deactivated = False, True


versions.warn_outside()  # one warning naming the tested span, for any version outside it
versions.warn_broken()  # one warning for packages that cannot work together (TorchTPU's libtpu replaced)
startup.quiet_absent_libtpu()  # libtpu installed on a host without TPU chips: before JAX may load it
startup.torchax_importable()  # torchax imports on torch 2.13, whoever imports it first
startup.quiet_known_noise()
if "torch" in sys.modules or startup.in_a_cluster():  # a cluster starts before user code can touch a JAX backend
    activate()
else:
    import_hooks.when_imported("diffusers.pipelines.pipeline_utils", lambda module: activate())

# The public names, and the submodules users reach from the package (``from diffusers_tpu import tiny`` in the
# notebooks, ``diffusers_tpu.stages.generate``, ``diffusers_tpu.lowering.export_method``): resolved on first use.
_NAMES = {
    "CausalWanTransformer3DModel": "families.causal_wan",
    "CausalWanPipeline": "families.causal_wan_pipeline",
    "CogVideoXPipeline": "families.cogvideox",
    "HunyuanVideo15Pipeline": "families.hunyuan_video15",
    "WanImageToVideoPipeline": "families.wan",
    "WanPipeline": "families.wan",
    "sharding_of": "interop.sharding",
    "CallStats": "runtime.call.call_stats",
    "stats": "runtime.attach.moves",
    "TPUConfig": "runtime.config",
    "from_pretrained": "runtime.weights.loading",
    "supported_pipelines": "runtime.support",
    "warm_up": "runtime.attach.warmup",
}
_SUBMODULES = {
    "tiny": "testing.tiny",
    "stages": "runtime.files.stages",
    "lowering": "planner.lowering",
    "wan": "families.wan",
}


def __getattr__(name: str):
    if name in _NAMES or name in _SUBMODULES:
        activate()
    if name in _NAMES:
        value = getattr(importlib.import_module(f"{__name__}.{_NAMES[name]}"), name)
        globals()[name] = value
        return value
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{_SUBMODULES[name]}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_NAMES) | set(_SUBMODULES))


__all__ = sorted(_NAMES) + ["__version__", "activate", "deactivate"]
