"""Every patch this project applies to diffusers, peft and torch's public API, each with its reason and guard.

This module sits at the top of the import graph (it imports the runtime); the low-level torch/torchax
compatibility patches live in ``compat`` at the bottom. Nothing else in the package modifies a third-party class:
family modules and the runtime only install per-instance overrides on the pipelines and modules a user moved to
JAX (undone by ``pipe.to("cpu")``).

Over 400 lines on purpose: every patch of diffusers', peft's and torch's public API lives here, each with its reason
and guard, so that one file answers "what does importing diffusers_tpu change".
"""

from __future__ import annotations

import functools
import logging
import os
import sys

import torch

from ..interop import backend, compat, import_hooks, patching, startup, torch_compat
from ..interop.torch_private import pytree
from . import diffusers_compat, registry, support
from .attach import moves, pipeline_runtime, shared_components
from .attention import sdpa
from .gpu_script import gpu_script_calls, group_offload
from .weights import loading, lora

logger = logging.getLogger(__name__)


# --- 1. DiffusionPipeline.to accepts "tpu" / "jax" --------------------------------------------------------
# Reason: stock ``to`` calls ``torch.device(arg)`` (pipeline_utils.py, ``to``), and torch has no "tpu" device;
# "jax" parses only after torchax renamed the private backend, and moving modules with ``module.to("jax")``
# leaves unsharded weights that only work inside the torchax environment. The patched method hands JAX targets
# to the runtime (which places, shards and compiles) and everything else to the stock method, after undoing a
# previous JAX placement. A native "tpu" torch device registered by another package is left alone.
# Guard: diffusers' ``to(*args, **kwargs)`` seam, tested on the declared span (``interop.versions``; outside it
# ``import diffusers_tpu`` warns).
# Applied when diffusers' ``pipeline_utils`` finishes importing (``import_hooks``): importing it costs seconds.


# what ``pipe.to(...)``'s arguments ask for: torch's own signatures, (device, dtype) in either form
def _device_arg(args, kwargs):
    if "device" in kwargs:
        return kwargs["device"]
    return args[0] if args and not isinstance(args[0], torch.dtype) else None


def _jax_target_of(args, kwargs) -> str | None:
    return backend.parse_device(_device_arg(args, kwargs))


def _dtype_of(args, kwargs) -> torch.dtype | None:
    if "dtype" in kwargs:
        return kwargs["dtype"]
    return next((a for a in args[:2] if isinstance(a, torch.dtype)), None)


def _is_dtype_only(args, kwargs) -> bool:
    return _device_arg(args, kwargs) is None and _dtype_of(args, kwargs) is not None


def _patch_pipeline_to(pipeline_utils):
    DiffusionPipeline = pipeline_utils.DiffusionPipeline  # the module itself: diffusers' lazy names may be mid-import

    patching.wrap(DiffusionPipeline, "to", _pipeline_to, "DiffusionPipeline.to")


def _pipeline_to(stock_to):
    @functools.wraps(stock_to)
    def to(self, *args, **kwargs):
        config = kwargs.pop("config", None)
        target = _jax_target_of(args, kwargs)
        if target is not None:
            for cls in type(self).__mro__:  # subclasses with their own __call__ (diffusers_tpu's, users')
                wrap_pipeline_call(cls)
            return moves.attach(self, target, config=config, dtype=_dtype_of(args, kwargs))
        if config is not None:
            raise ValueError(
                "`config=` only applies when moving a pipeline to JAX: use pipe.to('tpu', config=...) or "
                "pipe.to('jax', config=...)."
            )
        if pipeline_runtime.is_attached(self) and _is_dtype_only(args, kwargs):
            return moves.cast(self, _dtype_of(args, kwargs))
        dtype = _dtype_of(args, kwargs)
        if _device_arg(args, kwargs) is None and all(
            dtype is None or getattr(m, "dtype", dtype) == dtype
            for m in self.components.values()
            if isinstance(m, torch.nn.Module)
        ):  # ``to()``, or ``to(dtype)`` with every component in it (``from_pipe`` ends so): nothing moves, on JAX too
            return self
        moves.leave_jax(self)
        return stock_to(self, *args, **kwargs)

    return to


# --- 2. Supported pipelines' __call__ runs inside the torchax environment ------------------------------------
# Reason: after a JAX placement every tensor the stock ``__call__`` touches (latents, timesteps, embeddings) is a
# torchax tensor, which only computes inside the torchax environment. Wrapping ``__call__`` lets the stock body
# run unchanged. Pipelines never moved to JAX take the original path untouched.
# Guard: applied once per class that defines ``__call__``; the wrapper only acts on attached instances.
def wrap_pipeline_call(pipeline_cls) -> None:
    from diffusers import DiffusionPipeline  # noqa: PLC0415 - loads diffusers' pipelines: only once a user's do

    if "__call__" not in vars(pipeline_cls) or not issubclass(pipeline_cls, DiffusionPipeline):
        return

    def make(stock_call):
        @functools.wraps(stock_call)
        def __call__(self, *args, **kwargs):
            group_offload.before_call(self)
            attached = moves.for_call(self)
            if attached is None:
                return stock_call(self, *args, **kwargs)
            return attached.run_pipeline_call(stock_call, self, args, kwargs)

        return __call__

    patching.wrap(pipeline_cls, "__call__", make, f"{pipeline_cls.__name__}.__call__")


# --- 3. peft adapters next to a base layer that lives on JAX ------------------------------------------------
# Reason: peft moves a new adapter to its base layer's device (``_move_adapter_to_device_of_base_layer``), and
# ``tensor.to("jax")`` fails outside the torchax environment (``aten::empty_strided`` on the 'jax' backend), so a
# LoRA loaded into a moved pipeline would fail. The adapter stays on the host (cast to the base dtype); the
# runtime shards it like the layer it adapts before the next call. ``merge``/``unmerge`` (fuse_lora/unfuse_lora)
# compute on the weights: for a layer on JAX they run stock peft code on host copies of that layer's tensors,
# which go back to the devices with their sharding. Guard: only layers whose base weight is a torchax tensor
# take the new path (peft 0.17 - 0.21 method names); applied when peft's LoRA layers are imported, if ever.
# ``add_adapter`` on a moved model goes through ``LoraModel._replace_module``, which moves the new layer's adapters to
# the base weight's device itself: for a base on JAX they stay on the host the same way.
def _patch_peft_model(lora_model):
    def make(stock_replace):
        @functools.wraps(stock_replace)
        def replace_module(self, parent, child_name, new_module, child):
            if not lora.base_on_jax(new_module):
                return stock_replace(self, parent, child_name, new_module, child)
            setattr(parent, child_name, new_module)  # stock's one other step; adapters stay on the host
            return None

        return replace_module

    patching.wrap(lora_model.LoraModel, "_replace_module", make, "peft new adapter layers on JAX layers")


def _patch_peft(lora_layer):
    from peft.tuners.tuners_utils import BaseTunerLayer  # noqa: PLC0415 - optional (lora extra); loaded by now

    def make(stock_move):
        @functools.wraps(stock_move)
        def move_adapter(self, adapter_name, device=None):
            if device is None and lora.base_on_jax(self):
                device = torch.device("cpu")  # the dtype still follows the base layer
            return stock_move(self, adapter_name, device)

        return move_adapter

    patching.wrap(BaseTunerLayer, "_move_adapter_to_device_of_base_layer", make, "peft adapters on JAX layers")
    for cls in vars(lora_layer).values():
        if isinstance(cls, type) and issubclass(cls, lora_layer.LoraLayer):
            for name in ("merge", "unmerge"):
                if name in vars(cls):  # the class's own (a subclass inheriting it is wrapped through its parent)
                    patching.wrap(cls, name, lora.on_host_copies, f"peft {cls.__name__}.{name} on host copies")


# --- 4. torch.Generator("tpu") / torch.Generator("jax") ----------------------------------------------------
# Reason: GPU scripts write ``torch.Generator(device="cuda")``; torch rejects "tpu" ("Expected one of cpu, cuda,
# ... device type") and the "jax" backend has no generator. On JAX pipelines diffusers draws latents on the
# generator's device and moves them, so the TPU equivalent is a CPU generator: same stream as
# ``torch.Generator()``, the same latents stock torch CPU draws. ``torch.Generator`` becomes a subclass that maps
# those two device strings and leaves every other one (and isinstance checks on any generator) as they were.
# Guard: replaced once; a torch whose Generator already accepts "tpu" is left alone.
def _patch_generator():
    try:
        torch.Generator("tpu")
        return  # a native "tpu" generator exists (torch_xla or similar), or ours is in
    except RuntimeError:
        pass
    patching.wrap(torch, "Generator", _tpu_generator, "torch.Generator('tpu')")


def _tpu_generator(stock):
    class _AnyGenerator(type(stock)):
        def __instancecheck__(cls, instance):
            return isinstance(instance, stock)

        def __subclasscheck__(cls, subclass):
            return issubclass(subclass, stock)

    class Generator(stock, metaclass=_AnyGenerator):
        __doc__ = stock.__doc__

        def __new__(cls, device="cpu"):
            return stock(gpu_script_calls.generator_device(device))

    Generator.__module__, Generator.__qualname__ = stock.__module__, stock.__qualname__
    return Generator


# --- 5. Pipeline calls that mean something else on a TPU ---------------------------------------------------
# Reason: GPU scripts call CPU offloading, attention slicing and xformers; on a moved pipeline they would move
# sharded weights back and forth or swap the project's attention for a CUDA library. Each maps to its TPU
# meaning: CPU offloading with a JAX device (or on a moved pipeline) is offloading on JAX (``model_offload``,
# ``sequential_offload``); attention slicing and xformers on an attached pipeline warn once (``gpu_script_calls``).
# Guard: wrapped once; unattached pipelines with torch devices take the stock path.
_PORTED_METHODS = (
    "enable_model_cpu_offload",
    "enable_sequential_cpu_offload",
    "enable_attention_slicing",
    "enable_xformers_memory_efficient_attention",
)


def _patch_ported_methods(pipeline_utils):
    DiffusionPipeline = pipeline_utils.DiffusionPipeline
    for name in _PORTED_METHODS:
        if getattr(DiffusionPipeline, name, None) is not None:
            patching.wrap(DiffusionPipeline, name, functools.partial(_ported, name), f"DiffusionPipeline.{name}")


def _ported(name, stock):
    @functools.wraps(stock)
    def ported(self, *args, **kwargs):
        if name in ("enable_model_cpu_offload", "enable_sequential_cpu_offload"):
            # accelerate's hooks: loaded when a script offloads
            from .gpu_script import model_offload, sequential_offload  # noqa: PLC0415

            if model_offload.handles(self, args, kwargs):
                offload = model_offload if name == "enable_model_cpu_offload" else sequential_offload
                return offload.enable(self, args, kwargs)
        handled, result = gpu_script_calls.pipeline_method(self, pipeline_runtime.runtime_of(self), name, args, kwargs)
        return result if handled else stock(self, *args, **kwargs)

    return ported


# --- 6. Known noise: silenced at ``import diffusers_tpu`` (``startup.quiet_known_noise``) --------------------------


# --- 7. Modular pipelines refuse "tpu" / "jax" with the classic pipeline to use ------------------------------------
# Reason: diffusers' modular pipelines (``WanModularPipeline``, ``FluxModularPipeline``, ...) are not
# ``DiffusionPipeline``s: their own ``to`` calls ``torch.device("tpu")``, whose error says nothing useful, and the
# runtime does not run their block graphs. ``to("tpu")`` / ``to("jax")`` now raises before anything moves, naming the
# classic pipeline class that loads the same checkpoint and runs on JAX. Other devices take the stock method.
# Guard: diffusers 0.42's ``ModularPipeline.to``; applied when ``modular_pipeline`` is imported.
def _patch_modular_pipelines(modular_pipeline) -> None:
    cls = getattr(modular_pipeline, "ModularPipeline", None)
    if getattr(cls, "to", None) is not None:
        patching.wrap(cls, "to", _modular_to, "ModularPipeline.to")


def _modular_to(stock_to):
    @functools.wraps(stock_to)
    def to(self, *args, **kwargs):
        if _jax_target_of(args, dict(kwargs)) is not None:
            name = type(self).__name__
            classic = registry.classic_pipeline(name)
            use = (
                f"load the same checkpoint with diffusers.{classic}.from_pretrained(...) and move that with .to('tpu')"
                if classic
                else "load the checkpoint with its family's classic diffusers pipeline class and move that"
            )
            status = support.status(classic) if classic else ""
            raise ValueError(
                f"{name} is a diffusers modular pipeline, which diffusers_tpu does not run on JAX: {use}"
                + (f" ({classic} on JAX: {status})" if status else "")
                + ". Nothing was moved."
            )
        return stock_to(self, *args, **kwargs)

    return to


# --- 8. FLUX.2 klein's reference-token KV cache crosses program boundaries as arrays ------------------------------
# Reason: ``Flux2Transformer2DModel(kv_cache_mode="extract")`` returns a ``Flux2KVCache`` (per layer, the reference
# tokens' keys and values) that the next steps pass back in ``"cached"`` mode. A compiled program returned it as an
# opaque object holding traced values (a tracer leak: ``Flux2KleinKVPipeline`` failed). Registered as pytree nodes,
# its tensors become the program's outputs and the next program's inputs; ``num_ref_tokens`` is static.
# Guard: diffusers >= 0.42 (``transformer_flux2.Flux2KVCache``); applied when that module is imported.
def _register_flux2_kv_cache(transformer_flux2) -> None:
    cache, layer = (
        getattr(transformer_flux2, "Flux2KVCache", None),
        getattr(transformer_flux2, "Flux2KVLayerCache", None),
    )
    if cache is None or layer is None or layer in pytree.SUPPORTED_NODES:
        return

    def unflatten_layer(children, _):
        built = layer()
        built.k_ref, built.v_ref = children
        return built

    def unflatten_cache(children, context):
        double, single = children
        built = cache(0, 0)
        built.double_block_caches, built.single_block_caches, built.num_ref_tokens = list(double), list(single), context
        return built

    pytree.register_pytree_node(
        layer, lambda c: ((c.k_ref, c.v_ref), None), unflatten_layer, serialized_type_name="diffusers.Flux2KVLayerCache"
    )
    pytree.register_pytree_node(
        cache,
        lambda c: ((c.double_block_caches, c.single_block_caches), c.num_ref_tokens),
        unflatten_cache,
        serialized_type_name="diffusers.Flux2KVCache",
    )
    patching.record("Flux2KVCache as a pytree")


# --- 9. enable_layerwise_casting on a denoiser that is on JAX ----------------------------------------------------
# Reason: stock casts the module's weights with ``module.to(dtype)`` at once and around every layer's forward, which
# torchax tensors outside its environment refuse (and which a compiled program cannot do to its arguments). On JAX
# the chosen weights are stored in the storage dtype and cast inside the programs (``layerwise_casting``). Guard:
# diffusers 0.42's ``ModelMixin.enable_layerwise_casting``; a module not on JAX takes the stock method.


def _patch_model_methods(modeling_utils) -> None:
    cls = modeling_utils.ModelMixin
    if getattr(cls, "enable_layerwise_casting", None) is not None:
        patching.wrap(cls, "enable_layerwise_casting", _layerwise_on_jax, "ModelMixin.enable_layerwise_casting")


def _layerwise_on_jax(stock):
    @functools.wraps(stock)
    def enable_layerwise_casting(self, *args, **kwargs):
        runtime = shared_components.owner(self)
        if runtime is None or not runtime.attached:
            return stock(self, *args, **kwargs)
        from .gpu_script import layerwise_casting  # noqa: PLC0415 - diffusers' casting hooks load peft: only when used here

        return layerwise_casting.enable(runtime, self, stock, args, kwargs)

    return enable_layerwise_casting


# --- 10. DiffusionPipeline.from_pretrained(..., device_map="tpu" / "jax") -------------------------------------------
# Reason: diffusers' device maps are torch placements ("balanced", a device name); a JAX device name is refused
# ("jax not supported"). On JAX it means what ``pipe.to`` means: a local folder loads through the sharded loader
# (the denoisers' weights straight into their device shards, ``loading.from_pretrained``), anything else loads as
# stock and moves. Guard: diffusers 0.42's ``DiffusionPipeline.from_pretrained`` classmethod; other device maps
# take the stock path.
def _patch_device_map(pipeline_utils) -> None:
    cls = pipeline_utils.DiffusionPipeline
    stock = cls.from_pretrained.__func__

    @functools.wraps(stock)
    def from_pretrained(pipeline_class, path, *args, **kwargs):
        target = backend.parse_device(kwargs.get("device_map"))
        if target is None:
            return stock(pipeline_class, path, *args, **kwargs)
        kwargs.pop("device_map")
        if os.path.isdir(os.fspath(path)) and not args:
            chosen = None if pipeline_class is cls else pipeline_class  # the base class: the folder's own
            return loading.from_pretrained(os.fspath(path), device=target, pipeline_class=chosen, **kwargs)
        return stock(pipeline_class, path, *args, **kwargs).to(target)

    cls.from_pretrained = classmethod(from_pretrained)
    patching.record("DiffusionPipeline.from_pretrained(device_map='tpu')")


# --- 11. fuse_projections on an attention module that is on JAX ---------------------------------------------------
# Reason: ``fuse_qkv_projections()`` after the move concatenates q/k/v weights living on JAX outside a call
# (``JaxTensorOutsideCall``) and builds the fused layer on their device. Each module's ``fuse_projections`` (the
# model classes override it: ``WanAttention``, ...) runs on host copies, as LoRA merging does; the next call's
# resync places the fused layer. Guard: diffusers 0.42's ``Attention`` and ``AttentionMixin``.
def _patch_fuse_projections(module) -> None:
    if "fuse_projections" in vars(getattr(module, "Attention", object)):  # attention_processor's (UNets call it)
        patching.wrap(module.Attention, "fuse_projections", lora.module_on_host_copies, "Attention.fuse_projections")
    if "fuse_qkv_projections" in vars(getattr(module, "AttentionMixin", object)):
        patching.wrap(module.AttentionMixin, "fuse_qkv_projections", lora.each_fused_on_host, "fuse_qkv_projections")


# --- 12. AnimateDiff's FreeNoise switched on or off after the move --------------------------------------------------
# Reason: ``enable_free_noise()`` / ``disable_free_noise()`` replace each motion module's transformer blocks with new
# ones loaded from the old blocks' ``state_dict``: on JAX those are device arrays outside a call, which a host module
# cannot load (and a swap done on host copies gave a moved pipeline another video after ``disable_free_noise``: max-abs
# 0.10). The pipeline goes back to the host (its exact tensors), the stock method runs, and the pipeline is moved
# again as it was (its programs recompile). Guard: diffusers 0.42's ``AnimateDiffFreeNoiseMixin``.
def _patch_free_noise(module) -> None:
    mixin = getattr(module, "AnimateDiffFreeNoiseMixin", None)
    for name in ("enable_free_noise", "disable_free_noise"):
        if mixin is not None and name in vars(mixin):
            patching.wrap(mixin, name, _on_host_then_moved_again, f"AnimateDiffFreeNoiseMixin.{name}")


def _on_host_then_moved_again(stock):
    @functools.wraps(stock)
    def run(pipe, *args, **kwargs):
        runtime = pipeline_runtime.runtime_of(pipe)
        if runtime is None or not runtime.attached:
            return stock(pipe, *args, **kwargs)
        kind, config, dtype = runtime.moved_with
        moves.detach(pipe)
        try:
            return stock(pipe, *args, **kwargs)
        finally:
            moves.attach(pipe, kind, config=config, dtype=dtype)

    return run


# --- 13. A model built from a moved UNet's weights ---------------------------------------------------------------
# Reason: ``UNetMotionModel.from_unet2d(unet, ...)`` (AnimateDiff's ``__init__``, so ``AnimateDiffPipeline.from_pipe``
# of a moved SD pipeline) and ``ControlNetModel.from_unet(unet)`` load the UNet's ``state_dict`` into new host
# modules: on JAX those are device arrays outside a call. They read host copies of the UNet's tensors (its own stay
# where they are); the new model is a host model, placed by the next move or the next call. Guard: diffusers 0.42's
# classmethods, first argument the UNet.
def _patch_from_unet(module, cls_name: str, method: str) -> None:
    cls = getattr(module, cls_name, None)
    if cls is not None and method in vars(cls) and not hasattr(vars(cls)[method].__func__, "on_host_copies"):
        stock = vars(cls)[method].__func__

        @functools.wraps(stock)
        def from_unet(owner, unet, *args, **kwargs):
            return lora.module_on_host_copies(lambda model: stock(owner, model, *args, **kwargs))(unet)

        from_unet.on_host_copies = True
        setattr(cls, method, classmethod(from_unet))
        patching.record(f"{cls_name}.{method} on host copies")


# --- 14. Group offloading onto a JAX device ----------------------------------------------------------------------
# Reason: stock's hooks move groups of layers to the onload device around their forward; outside a call the 'jax'
# device is the host, so they would run everything on torch CPU, silently not on JAX. ``_apply_group_offloading``
# (which ``apply_group_offloading`` and ``ModelMixin.enable_group_offload`` reach after stock's checks, CUDA streams
# left out) marks the module instead, and ``DiffusionPipeline.enable_group_offload`` moves the pipeline: group
# offloading on JAX (``group_offload``). Guard: diffusers 0.42's ``hooks.group_offloading``
# (``apply_group_offloading(module, onload_device, ...)`` also bound in ``diffusers.hooks``, ``_apply_group_offloading(
# module, config)``); other onload devices take the stock path.
def _patch_group_offloading(group_offloading) -> None:
    if getattr(group_offloading, "_apply_group_offloading", None) is None:
        return
    patching.wrap(group_offloading, "apply_group_offloading", group_offload.apply_function, "apply_group_offloading")
    patching.wrap(
        group_offloading,
        "_apply_group_offloading",
        functools.partial(group_offload.apply_config, wrap_calls=_wrap_every_pipeline_call),
        "_apply_group_offloading",
    )
    hooks = sys.modules.get("diffusers.hooks")
    if hooks is not None and "apply_group_offloading" in vars(hooks):  # bound there when the package imported it
        hooks.apply_group_offloading = group_offloading.apply_group_offloading


def _wrap_every_pipeline_call() -> None:
    """A component marked for group offloading onto JAX moves whichever pipeline calls it: every pipeline class loaded
    so far gets the wrapped ``__call__`` (a class loaded later is wrapped by its first ``to("tpu")``)."""
    from diffusers import DiffusionPipeline  # noqa: PLC0415 - loaded already when a model is offloaded

    classes, seen = [DiffusionPipeline], set()
    while classes:
        cls = classes.pop()
        if cls not in seen:
            seen.add(cls)
            wrap_pipeline_call(cls)
            classes.extend(cls.__subclasses__())


def _patch_pipelines(pipeline_utils) -> None:
    if getattr(pipeline_utils.DiffusionPipeline, "enable_group_offload", None) is not None:
        patching.wrap(
            pipeline_utils.DiffusionPipeline,
            "enable_group_offload",
            group_offload.pipeline_method,
            "DiffusionPipeline.enable_group_offload",
        )
    _patch_pipeline_to(pipeline_utils)
    _patch_ported_methods(pipeline_utils)
    _patch_device_map(pipeline_utils)
    diffusers_compat.apply(pipeline_utils)


def apply() -> None:
    """Apply every patch (idempotent): torch's and torchax's now, diffusers' and peft's when each is imported.
    Called by ``import diffusers_tpu``. Pipeline classes get their ``__call__`` wrapped by their first ``to("tpu")``."""
    torch_compat.apply()  # first: library code may ask torch for the accelerator as soon as torchax is in
    compat.apply()
    compat.route_sdpa(sdpa.scaled_dot_product_attention)
    _patch_generator()
    import_hooks.when_imported("diffusers.pipelines.pipeline_utils", _patch_pipelines)
    import_hooks.when_imported("diffusers.models.modeling_utils", _patch_model_methods)
    import_hooks.when_imported("diffusers.hooks.group_offloading", _patch_group_offloading)
    for module in ("diffusers.models.attention_processor", "diffusers.models.attention"):
        import_hooks.when_imported(module, _patch_fuse_projections)
    import_hooks.when_imported("diffusers.pipelines.free_noise_utils", _patch_free_noise)
    import_hooks.when_imported(
        "diffusers.models.unets.unet_motion_model",
        lambda m: _patch_from_unet(m, "UNetMotionModel", "from_unet2d"),
    )
    import_hooks.when_imported(
        "diffusers.models.controlnets.controlnet", lambda m: _patch_from_unet(m, "ControlNetModel", "from_unet")
    )
    import_hooks.when_imported("peft.tuners.lora.layer", _patch_peft)
    import_hooks.when_imported("peft.tuners.lora.model", _patch_peft_model)
    import_hooks.when_imported("diffusers.modular_pipelines.modular_pipeline", _patch_modular_pipelines)
    import_hooks.when_imported("diffusers.models.transformers.transformer_flux2", _register_flux2_kv_cache)


def applied() -> list[str]:
    """Names of the patches in effect, for bug reports."""
    return sorted(set(patching.applied()) | startup.applied())
