"""Where the project enters stock code: ``DiffusionPipeline.to`` takes ``"tpu"`` / ``"jax"`` (the product's entry
point), a moved pipeline's ``__call__`` runs in its runtime, ``torch.Generator("tpu")``, the GPU-script methods that
mean something else on a TPU, group offloading onto JAX, and ``apply``, which applies every patch of diffusers', peft's
and torch's public API (the rest in ``stock_classes``), each with its reason and guard.

This room sits at the top of the runtime (it imports the rest); torch's and torchax's patches live in
``interop/compat/`` at the bottom. Nothing else in the package modifies a third-party class: family modules and the
runtime only install per-instance overrides on the pipelines and modules a user moved to JAX (undone by
``pipe.to("cpu")``).
"""

from __future__ import annotations

import functools
import logging
import os

import torch

from ...interop import backend, import_hooks, patching, startup
from ...interop.compat import shared_device, torch_itself, torchax_tensors
from .. import to_arguments
from ..attach import gpu_script_calls, moves, pipeline_runtime
from ..attention import sdpa
from ..gpu_script import group_offload
from ..weights import loading
from . import older_diffusers, stock_classes

logger = logging.getLogger(__name__)


# --- DiffusionPipeline.to accepts "tpu" / "jax" --------------------------------------------------------
# Reason: stock ``to`` calls ``torch.device(arg)`` (pipeline_utils.py, ``to``), and torch has no "tpu" device;
# "jax" parses only after torchax renamed the private backend, and moving modules with ``module.to("jax")``
# leaves unsharded weights that only work inside the torchax environment. The patched method hands JAX targets
# to the runtime (which places, shards and compiles) and everything else to the stock method, after undoing a
# previous JAX placement. Beside TorchTPU, whose "tpu" is a torch device, a pipeline's "tpu" is still the JAX path
# (``interop.compat.shared_device``).
# Guard: diffusers' ``to(*args, **kwargs)`` seam, tested on the declared span (``interop.versions``; outside it
# ``import diffusers_tpu`` warns).
# Applied when diffusers' ``pipeline_utils`` finishes importing (``import_hooks``): importing it costs seconds.


def _patch_pipeline_to(pipeline_utils):
    DiffusionPipeline = pipeline_utils.DiffusionPipeline  # the module itself: diffusers' lazy names may be mid-import

    patching.wrap(DiffusionPipeline, "to", _pipeline_to, "DiffusionPipeline.to")


def _pipeline_to(stock_to):
    @functools.wraps(stock_to)
    def to(self, *args, **kwargs):
        config = kwargs.pop("config", None)
        target = to_arguments.jax_target_of(args, kwargs)
        if target is not None:
            for cls in type(self).__mro__:  # subclasses with their own __call__ (diffusers_tpu's, users')
                wrap_pipeline_call(cls)
            return moves.attach(self, target, config=config, dtype=to_arguments.dtype_of(args, kwargs))
        if config is not None:
            raise ValueError(
                "`config=` only applies when moving a pipeline to JAX: use pipe.to('tpu', config=...) or "
                "pipe.to('jax', config=...)."
            )
        if pipeline_runtime.is_attached(self) and to_arguments.is_dtype_only(args, kwargs):
            return moves.cast(self, to_arguments.dtype_of(args, kwargs))
        dtype = to_arguments.dtype_of(args, kwargs)
        if to_arguments.device_arg(args, kwargs) is None and all(
            dtype is None or getattr(m, "dtype", dtype) == dtype
            for m in self.components.values()
            if isinstance(m, torch.nn.Module)
        ):  # ``to()``, or ``to(dtype)`` with every component in it (``from_pipe`` ends so): nothing moves, on JAX too
            return self
        moves.leave_jax(self)
        return stock_to(self, *args, **kwargs)

    return to


# --- Supported pipelines' __call__ runs inside the torchax environment ------------------------------------
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
            runtime = catch_up(self)
            if runtime is None:
                return stock_call(self, *args, **kwargs)
            return runtime.run_pipeline_call(stock_call, self, args, kwargs)

        return __call__

    patching.wrap(pipeline_cls, "__call__", make, f"{pipeline_cls.__name__}.__call__")


def catch_up(pipe):
    """The one step a pipeline call takes before it runs: the placement brought up to date with what the user changed
    since the move, each change named in a log line (nothing else re-places anything during a call). Components marked
    for group offloading onto JAX move the pipeline there with them (``group_offload.before_call``); a component
    replaced, or held on JAX by another pipeline sharing it, moves the pipeline again as it was moved
    (``moves.for_call``); a ``torch.compile``'d component runs its original module and weights an offload hook left
    on the host come back (``PipelineRuntime.catch_up``). Returns the runtime the call runs in, None for plain torch."""
    group_offload.before_call(pipe)
    runtime = moves.for_call(pipe)
    if runtime is not None and not runtime.inside_call():  # (a subclass's __call__ around the stock one: done)
        runtime.catch_up()
    return runtime


# --- torch.Generator("tpu") / torch.Generator("jax") ----------------------------------------------------
# Reason: GPU scripts write ``torch.Generator(device="cuda")``; torch rejects "tpu" ("Expected one of cpu, cuda,
# ... device type") and the "jax" backend has no generator. On JAX pipelines diffusers draws latents on the
# generator's device and moves them, so the TPU equivalent is a CPU generator: same stream as
# ``torch.Generator()``, the same latents stock torch CPU draws. ``torch.Generator`` becomes a subclass that maps
# those two device strings and leaves every other one (and isinstance checks on any generator) as they were.
# Guard: replaced once; beside TorchTPU, whose "tpu" is a torch device (``compat.shared_device``), torch.Generator
# stays TorchTPU's (asked by parsing the name: making a TorchTPU generator would start its runtime).
def _patch_generator():
    if not shared_device.shared():
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


# --- Pipeline calls that mean something else on a TPU ---------------------------------------------------
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
            from ..gpu_script import model_offload, sequential_offload  # noqa: PLC0415

            if model_offload.handles(self, args, kwargs):
                offload = model_offload if name == "enable_model_cpu_offload" else sequential_offload
                return offload.enable(self, args, kwargs)
        handled, result = gpu_script_calls.pipeline_method(self, pipeline_runtime.runtime_of(self), name, args, kwargs)
        return result if handled else stock(self, *args, **kwargs)

    return ported


# --- DiffusionPipeline.from_pretrained(..., device_map="tpu" / "jax") -------------------------------------------
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

    patching.replace(
        cls, "from_pretrained", classmethod(from_pretrained), "DiffusionPipeline.from_pretrained(device_map='tpu')"
    )


# --- Group offloading onto a JAX device ----------------------------------------------------------------------
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
    # the package binds it too (``from .group_offloading import apply_group_offloading``), once its body has run
    import_hooks.when_imported("diffusers.hooks", functools.partial(_bind_in_hooks, group_offloading))


def _bind_in_hooks(group_offloading, hooks) -> None:
    ours = group_offloading.apply_group_offloading
    if vars(hooks).get("apply_group_offloading", ours) is not ours:
        patching.replace(hooks, "apply_group_offloading", ours, "diffusers.hooks binding")


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
    older_diffusers.apply(pipeline_utils)


def apply() -> None:
    """Apply every patch (idempotent): torch's and torchax's now, diffusers' and peft's when each is imported.
    Called by ``import diffusers_tpu``. Pipeline classes get their ``__call__`` wrapped by their first ``to("tpu")``."""
    torch_itself.apply()  # first: library code may ask torch for the accelerator as soon as torchax is in
    shared_device.apply()
    torchax_tensors.apply()
    torchax_tensors.route_sdpa(sdpa.scaled_dot_product_attention)
    _patch_generator()
    import_hooks.when_imported("diffusers.pipelines.pipeline_utils", _patch_pipelines)
    import_hooks.when_imported("diffusers.hooks.group_offloading", _patch_group_offloading)
    stock_classes.register()


def applied() -> list[str]:
    """Names of the patches in effect, for bug reports."""
    return sorted(set(patching.applied()) | startup.applied())
