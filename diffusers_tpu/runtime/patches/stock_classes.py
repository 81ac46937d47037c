"""The patches of diffusers' and peft's classes a moved pipeline needs beyond its entry points (``entry_points``):
peft adapters beside a base layer on JAX, modular pipelines refused, FLUX.2's KV cache as arrays, layerwise casting,
fused projections, FreeNoise and models built from a moved UNet. Each with its reason and guard, applied when its
module is imported (``register``, called by ``entry_points.apply``)."""

from __future__ import annotations

import functools
import logging

import torch

from ...interop import import_hooks, patching, torch_private
from ...interop.torch_private import pytree
from .. import diffusers_private, registry, support, to_arguments
from ..attach import moves, pipeline_runtime, shared_components
from ..weights import lora

logger = logging.getLogger(__name__)


# --- peft adapters next to a base layer that lives on JAX ------------------------------------------------
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


# --- Modular pipelines refuse "tpu" / "jax" with the classic pipeline to use ------------------------------------
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
        if to_arguments.jax_target_of(args, dict(kwargs)) is not None:
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


# --- FLUX.2 klein's reference-token KV cache crosses program boundaries as arrays ------------------------------
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
    patching.record(
        "Flux2KVCache as a pytree", lambda: (torch_private.deregister(layer), torch_private.deregister(cache))
    )


# --- enable_layerwise_casting on a denoiser that is on JAX ----------------------------------------------------
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
        from ..gpu_script import layerwise_casting  # noqa: PLC0415 - diffusers' casting hooks load peft: only when used here

        return layerwise_casting.enable(runtime, self, stock, args, kwargs)

    return enable_layerwise_casting


# --- fuse_projections on an attention module that is on JAX ---------------------------------------------------
# Reason: ``fuse_qkv_projections()`` after the move concatenates q/k/v weights living on JAX outside a call
# (``JaxTensorOutsideCall``) and builds the fused layer on their device. Each module's ``fuse_projections`` (the
# model classes override it: ``WanAttention``, ...) runs on host copies, as LoRA merging does; the next call's
# resync places the fused layer. Guard: diffusers 0.42's ``Attention`` and ``AttentionMixin``.
def _patch_fuse_projections(module) -> None:
    if "fuse_projections" in vars(getattr(module, "Attention", object)):  # attention_processor's (UNets call it)
        patching.wrap(module.Attention, "fuse_projections", lora.module_on_host_copies, "Attention.fuse_projections")
    if "fuse_qkv_projections" in vars(getattr(module, "AttentionMixin", object)):
        patching.wrap(module.AttentionMixin, "fuse_qkv_projections", lora.each_fused_on_host, "fuse_qkv_projections")


# --- AnimateDiff's FreeNoise switched on or off after the move --------------------------------------------------
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


# --- A model built from a moved UNet's weights ---------------------------------------------------------------
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
        patching.replace(cls, method, classmethod(from_unet), f"{cls_name}.{method} on host copies")


# --- diffusers' flex attention backend on JAX tensors -----------------------------------------------------------
# Reason: models that build a ``BlockMask`` name the ``flex`` backend themselves (AnyFlow FAR, Kandinsky 6 SR); torch's
# ``flex_attention`` has no JAX lowering. The registry's flex function is served once, for the process: JAX tensors
# take ``flex_attention.flex_as_sdpa`` (the mask made dense, the project's attention), any other the stock function.
# Guard: replaces the one registered ``AttentionBackendName.FLEX`` function (diffusers 0.38 - 0.42) once; undone by
# ``deactivate``.
def _serve_flex_on_jax(attention_dispatch) -> None:
    from ..attention import flex_attention  # noqa: PLC0415 - imports torch's flex attention: only with the dispatch

    if "flex attention on JAX tensors" not in patching.applied():
        undo = diffusers_private.serve_backend(attention_dispatch.AttentionBackendName.FLEX, flex_attention.serving_jax)
        patching.record("flex attention on JAX tensors", undo)


def register() -> None:
    """Each patch applied when its module is imported (now, if it is imported already)."""
    import_hooks.when_imported("diffusers.models.modeling_utils", _patch_model_methods)
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
    import_hooks.when_imported("diffusers.models.attention_dispatch", _serve_flex_on_jax)
