"""Every program a pipeline call compiles, compiled for a TPU slice by the TPU compiler, no TPU attached.

For any pipeline the runtime supports (a family file or the generic path), ``compile_call(pipe, call, devices)``:

1. runs the stock pipeline once on the host (torch, one denoising step) with recorders on its VAE's compiled methods
   (``Family.vae_methods``; ``vae.decode`` for VAEs with their own programs, ``Family.vae_install``): the shapes
   those programs take;
2. attaches the runtime for the TPU ``devices`` without placing a weight (``plan``'s abstract weights, sharded as
   ``pipe.to`` shards them) and probes the pipeline up to its first denoiser call (``call_probe.probe_denoiser_call``,
   text encoders run on the host): the denoiser's step as the runtime compiles it, guidance pair batched;
3. compiles the step and every recorded VAE program for ``devices`` and returns what ``analyse`` reads of each (a
   forward JAX cannot trace, which the runtime runs eagerly with its parts compiled one by one: ``{"eager": why}``).

``plan`` and ``cost`` analyse the planned families at real sizes; this covers every family at any size, for tests
(``tests/planner/test_tpu_families.py``) and for a user checking that their pipeline compiles for TPU before renting
one.
"""

from __future__ import annotations

import contextlib
import inspect

import torch
from torch.utils import _pytree as pytree

from ..interop import patching, program_figures
from ..runtime.call.denoiser import TRACE_ERRORS
from ..runtime.config import TPUConfig
from ..runtime.registry import family_of
from . import abstract_weights, call_probe, plan, program_memory, tpu_compiler


def _keywords(pipe, call: dict) -> dict:
    """``call`` restricted to what the pipeline's ``__call__`` takes, two denoising steps."""
    parameters = inspect.signature(pipe.__call__).parameters
    keywords = {k: v for k, v in call.items() if k in parameters and k not in ("output_type", "generator")}
    if "num_inference_steps" in parameters:
        keywords["num_inference_steps"] = 2  # (one breaks some schedules: Mochi divides by steps - 1)
    return keywords


@contextlib.contextmanager
def _recording(targets: list, seen: dict):
    """``(owner, method name)`` pairs wrapped to record each call's tensors as shapes (first call per shape)."""
    recorders = {}
    for owner, name in targets:
        original = getattr(owner, name)

        def recorder(*args, _original=original, _key=(id(owner), name), **kwargs):
            leaves = pytree.tree_leaves((args, kwargs))
            signature = (_key, tuple((tuple(x.shape), x.dtype) if isinstance(x, torch.Tensor) else x for x in leaves))
            if signature not in seen:
                seen[signature] = (
                    _key,
                    pytree.tree_map(
                        lambda x: torch.zeros(x.shape, dtype=x.dtype) if isinstance(x, torch.Tensor) else x,
                        (args, kwargs),
                    ),
                )
            return _original(*args, **kwargs)

        recorders[(owner, name)] = recorder
    with patching.temporarily(recorders):
        yield


def _vae_targets(pipe, family) -> list:
    vae = getattr(pipe, "vae", None)
    if vae is None:
        return []
    if family.vae_install is not None:
        return [(vae, "decode")]
    targets = []
    for spec in family.vae_methods:
        path, _, method = spec.rpartition(".")
        if method == "forward" and path.split(".")[-1] == "encoder":
            continue  # text-to-video calls never encode
        targets.append((vae.get_submodule(path) if path else vae, method))
    return targets


def _paired_arguments(family) -> set:
    return family.cfg.paired_arguments if family.cfg is not None else {"encoder_hidden_states"}


def compile_call(pipe, call: dict, devices, config=None, analyse=None, vae: bool = True) -> dict:
    """``{program name: analyse(lowered)}`` for the denoiser step and the VAE decode programs of ``pipe(**call)``
    compiled for ``devices`` (see the module docstring). ``config``: the ``TPUConfig`` they are compiled for
    (default: ``TPUConfig()``, text encoders on the host); ``analyse``: default the memory analysis; ``vae=False``:
    the denoiser step only."""
    config = config or TPUConfig(text_encoder="host")
    analyse = analyse or program_figures.compiled_memory
    family = family_of(pipe)
    keywords = _keywords(pipe, call)
    seen: dict = {}
    with _recording(_vae_targets(pipe, family) if vae else [], seen), torch.no_grad():
        pipe(**keywords, generator=torch.Generator().manual_seed(0))
    results = {}
    with plan.attached(pipe, config, devices) as runtime:
        denoiser = runtime.decision.component(family.denoisers[0])  # as pipe.to places it
        module, rules = denoiser.module, denoiser.rules
        state = abstract_weights.abstract_component(denoiser, runtime.mesh, config)
        entry = runtime.denoiser_entry(module, rules, state=lambda: state)
        args, kwargs, guided = call_probe.probe_denoiser_call(
            pipe,
            {**keywords, "guidance_scale": call.get("guidance_scale", 5.0)},
            None,
            abstract_weights.reported_dtype(module, state),
            runtime,
            prompt=call.get("prompt"),
            keywords=keywords,
        )
        # true classifier-free guidance (Flux, Qwen-Image): a negative prompt and true_cfg_scale > 1
        guided = guided or (call.get("true_cfg_scale", 1.0) > 1 and call.get("negative_prompt") is not None)
        batch = 2 if runtime.pairing is not None and guided else 1
        paired = _paired_arguments(family)  # the arguments the runtime batches as the guidance pair
        args = pytree.tree_map(lambda value: call_probe.concrete(value, batch), args)
        kwargs = {
            name: pytree.tree_map(lambda value: call_probe.concrete(value, batch if name in paired else 1), value)
            for name, value in kwargs.items()
        }
        try:
            lowered, _ = program_figures.lowered_output_shapes(entry.whole, *args, **kwargs)
            results["denoiser_step"] = analyse(lowered)
        except TRACE_ERRORS as error:  # the runtime runs such a forward eagerly, its parts as units
            results["denoiser_step"] = {"eager": f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"}
        vae = getattr(pipe, "vae", None) if vae else None
        # each VAE program analysed as the runtime builds it (TPUConfig.vae_compile)
        submit = program_memory.vae_submit(lambda low: program_memory.compiled_now(low, analyse), config, runtime)
        if vae is not None and family.vae_install is not None:
            for _, (recorded_args, _) in seen.values():
                latents = recorded_args[0]
                decode = program_memory.vae_decode_started(
                    pipe,
                    config,
                    runtime,
                    (1, *latents.shape[1:]),
                    config.vae_decode_chunk,
                    submit,
                )()
                results.update({f"vae_{name}": report for name, report in decode.items() if name != "peak_bytes"})
        elif vae is not None:
            weights, submit = program_memory.held_weights(config, runtime, "vae", submit)
            for number, ((owner_id, method), (recorded_args, recorded_kwargs)) in enumerate(seen.values()):
                owner = next(m for m in vae.modules() if id(m) == owner_id)
                prefix = next(n for n, m in vae.named_modules() if m is owner)
                prefix = f"{prefix}." if prefix else ""
                owned = {n[len(prefix) :]: v for n, v in weights.items() if n.startswith(prefix)}
                compiled = runtime.compiled_vae_method(owner, method, lambda owned=owned: owned)
                results[f"vae_{prefix}{method}_{number}"] = submit(
                    program_figures.lower(compiled, *recorded_args, **recorded_kwargs)
                ).result()
    return results


def compile_for(pipe, call: dict, chip: str, **options) -> dict:
    """``compile_call`` for a named slice (``--chips`` name)."""
    return compile_call(pipe, call, tpu_compiler.devices(chip), **options)
