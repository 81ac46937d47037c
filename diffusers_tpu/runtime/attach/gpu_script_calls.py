"""GPU-script calls that mean something else on a TPU: each gets a defined behaviour (docs/porting.md).

- ``enable_model_cpu_offload(device="tpu")``: model offload on JAX (``model_offload``);
- ``enable_sequential_cpu_offload(device="tpu")``: sequential offload on JAX (``sequential_offload``);
- offload enabled before ``pipe.to("tpu")``: its hooks are removed (weights back on the host), then the move, one
  warning;
- ``enable_attention_slicing()``, ``enable_xformers_memory_efficient_attention()``: ignored, one warning: attention
  is a flash kernel that never holds the score matrix;
- ``transformer.set_attention_backend(name)`` / ``attention_backend(name)``: the JAX kernel (``TPUConfig.attention``)
  runs instead, one warning; the backend applies again on ``pipe.to("cuda")``;
- ``transformer.compile()``, ``torch.compile(pipe.transformer)``: ignored on JAX (XLA compiles every module), one
  warning; restored on ``pipe.to("cuda")``;
- ``torch_dtype=torch.float16`` with ``pipe.to("tpu")``: runs in float16, one warning: TPUs compute natively in
  bfloat16;
- ``torch.Generator("tpu")``: a CPU generator (``patches``): the same latents as stock torch with a CPU generator.
"""

from __future__ import annotations

import contextlib
import logging

import torch

from .. import diffusers_private

# processors built around a BlockMask (AnyFlow FAR, Kandinsky 6 SR) keep the flex backend: on JAX
# ``flex_attention.serving_jax`` serves it
FLEX_BACKENDS = ("flex", "_native_flex")

logger = logging.getLogger(__name__)
_warned: set[str] = set()


def warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        logger.warning(message)


def generator_device(device):
    """``torch.Generator(device)`` on a JAX device string draws on the CPU (diffusers moves the latents)."""
    kind = device.type if isinstance(device, torch.device) else str(device).split(":")[0].strip().lower()
    return "cpu" if kind in ("tpu", "jax", "privateuseone") else device


def offload_device(args, kwargs):
    """The ``device`` an ``enable_*_cpu_offload(gpu_id=None, device=None)`` call names (positional or keyword)."""
    if "device" in kwargs:
        return kwargs["device"]
    return args[1] if len(args) > 1 else None


def pipeline_method(pipe, runtime, name: str, args, kwargs) -> tuple[bool, object]:
    """(handled, result) for a ported ``DiffusionPipeline`` method; not handled: the stock method runs.
    ``runtime``: the pipeline's ``PipelineRuntime``, or None when it is not on JAX."""
    attached = runtime is not None
    if attached:  # enable_attention_slicing / enable_xformers_memory_efficient_attention (offloading: its modules)
        warn_once(
            name,
            f"{name}() on a pipeline on JAX is ignored: attention already runs through a flash kernel "
            f"({runtime.attention.implementation}) that never materializes the attention "
            "matrix.",
        )
        return True, None
    return False, None


def prepare_components(pipe) -> list:
    """Before placement: undo what a GPU script set up that cannot run on JAX. Returns the steps that restore it
    (on detach)."""
    undo = []
    if any(hasattr(m, "_hf_hook") for m in pipe.components.values() if isinstance(m, torch.nn.Module)):
        warn_once(
            "offloaded",
            "CPU offloading (enable_model_cpu_offload / enable_sequential_cpu_offload) was enabled "
            "on this pipeline; on JAX its weights are sharded over the devices instead, so the offload hooks "
            "are removed.",
        )
        pipe.remove_all_hooks()
    for name, module in list(pipe.components.items()):
        original = getattr(module, "_orig_mod", None)
        if isinstance(module, torch.nn.Module) and isinstance(original, torch.nn.Module):  # torch.compile(module)
            warn_once(
                f"torch.compile-{name}",
                f"pipe.{name} is torch.compile'd; on JAX XLA compiles it, so the "
                "original module is used (the compiled wrapper comes back on pipe.to('cpu' / 'cuda')).",
            )
            setattr(pipe, name, original)
            undo.append(lambda name=name, module=module: setattr(pipe, name, module))
    return undo


def install_module_overrides(runtime, module: torch.nn.Module) -> None:
    """A placed module ignores ``compile()`` and ``set_attention_backend`` while on JAX (restored on detach)."""
    deferred = {}

    if getattr(module, "_compiled_call_impl", None) is not None:  # module.compile() called before the move
        deferred["_compiled_call_impl"] = module._compiled_call_impl
        module._compiled_call_impl = None
        warn_once(
            f"compile-{id(module)}",
            f"{type(module).__name__}.compile() has no effect on JAX (XLA compiles the "
            "module); it applies again when the pipeline goes back to torch.",
        )

    def restore():
        for attribute, value in deferred.items():
            setattr(module, attribute, value)

    runtime.overrides.add_undo(restore, f"{type(module).__name__}.compile's state")

    def compile_(*args, **kwargs):
        warn_once(
            f"compile-{id(module)}",
            f"{type(module).__name__}.compile() has no effect on JAX (XLA compiles "
            "the module); it applies again when the pipeline goes back to torch.",
        )
        stock_compile = type(module).compile
        stock_compile(module, *args, **kwargs)
        deferred["_compiled_call_impl"] = module._compiled_call_impl
        module._compiled_call_impl = None

    runtime.overrides.set(module, "compile", compile_)
    if not hasattr(type(module), "set_attention_backend"):
        return
    chosen = _native_backend(module)  # once, through diffusers' public set_attention_backend
    if any(backend is not None for backend in chosen.values()):
        warn_once(
            f"backend-{id(module)}",
            f"attention backend {sorted({str(b) for b in chosen.values() if b is not None})} set on "
            f"{type(module).__name__}: on JAX "
            f"attention runs through {runtime.attention.implementation} (TPUConfig.attention); the backend applies "
            "again when the pipeline goes back to torch.",
        )
    runtime.overrides.add_undo(lambda: _restore_backends(chosen), f"{type(module).__name__}'s attention backends")

    def set_attention_backend(backend_name: str) -> None:
        type(module).set_attention_backend(module, backend_name)  # stock validation; the choice kept for torch
        chosen.update(_native_backend(module))
        logger.warning(
            "set_attention_backend(%r) on a module on JAX: attention runs through %s (TPUConfig.attention); "
            "the backend applies when the pipeline goes back to torch.",
            backend_name,
            runtime.attention.implementation,
        )

    runtime.overrides.set(module, "set_attention_backend", set_attention_backend)


def _native_backend(module) -> dict:
    """Name diffusers' native backend (SDPA, which runs the project's kernel on JAX) on every attention processor of
    ``module`` with the public ``set_attention_backend``, once; processors built around a ``BlockMask`` keep ``flex``
    (served on JAX, ``stock_classes``). Returns {processor: the backend it named before (None: none)} for the others."""
    processors = [owner.processor for owner in _attention_modules(module)]
    before = {p: diffusers_private.processor_backend(p) for p in processors if hasattr(p, "_attention_backend")}
    active = diffusers_private.active_attention_backend()
    quiet = logging.getLogger("diffusers.models.modeling_utils")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # its "experimental feature" warning, once per call: ours, not the user's
    try:
        type(module).set_attention_backend(module, diffusers_private.NATIVE.value)
    finally:
        quiet.setLevel(level)
        diffusers_private.make_active(active)  # it also makes its backend the process's: the user's stays
    for processor, backend in before.items():
        if backend in FLEX_BACKENDS:
            diffusers_private.name_processor_backend(processor, backend)
    return {p: b for p, b in before.items() if b not in FLEX_BACKENDS}


def _restore_backends(chosen: dict) -> None:
    for processor, backend in chosen.items():
        diffusers_private.name_processor_backend(processor, backend)


def _attention_modules(module):
    return [m for m in module.modules() if hasattr(m, "processor") and not isinstance(m.processor, type)]


def check_dtype(runtime, modules: dict) -> None:
    """float16 on a real TPU: works, but TPUs have no native float16 math."""
    if runtime.target.requested != "tpu":
        return
    for name, module in modules.items():
        if any(p.dtype == torch.float16 for p in module.parameters()):
            warn_once(
                f"float16-{name}",
                f"{name} is float16: TPUs compute natively in bfloat16 (float16 is emulated, "
                "slower). Load with torch_dtype=torch.bfloat16 for TPU speed; float16 results stay as stock's.",
            )


def attention_dispatch_on_jax():
    """The context JAX calls run in for diffusers' attention dispatch: nothing to do, as every placed model's
    processors name the native backend (``install_module_overrides``) — unless a backend was made active for every
    processor (``diffusers.attention_backend(...)`` around the call, ``DIFFUSERS_ATTN_BACKEND``): a processor of a
    model diffusers does not reach by ``set_attention_backend`` would take it, so native is entered for the call."""
    active = diffusers_private.active_attention_backend()
    if active == diffusers_private.NATIVE:
        return contextlib.nullcontext()
    warn_once(
        f"dispatch-{active}",
        f"attention_backend({active.value!r}) is active: on JAX attention runs through the project's kernel "
        "(TPUConfig.attention) instead.",
    )
    return diffusers_private.native_attention()
