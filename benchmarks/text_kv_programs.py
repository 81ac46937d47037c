"""TextKVCache's whole-step programs for a real-size NucleusMoE-Image transformer on a TPU slice, compiled by the TPU
compiler (no TPU needed).

    python benchmarks/text_kv_programs.py --chips v6e-8 --height 1024 --width 1024 --text-tokens 256

A benchmark, not a test (minutes of compiling per program). The transformer is diffusers' class at its default
configuration (24 blocks of 2048 features, 16 heads; blocks 3-22 of 128 experts with expert-choice routing at
capacity factor 8; text states of 3584 features), its parameters abstract. For one guided step (the CFG pair as one
batch over dp, as the runtime runs it) it compiles, exactly as the runtime builds them (``Denoiser.cached_program``):
the uncached step, TextKVCache's computing program (every block's text keys and values made and returned, stacked
over the layers) and its reusing program (read from those). Each row is read as ``cache_programs.figures`` reads it:
FLOPs with loop bodies times their trip counts, memory per device, compile seconds, the compiler's own estimate.
"""

from __future__ import annotations

import argparse
import json

import diffusers
import jax
import torch
from cache_programs import figures

from diffusers_tpu.interop import program_figures
from diffusers_tpu.interop.torch_private import pytree
from diffusers_tpu.planner import abstract_weights, architectures, call_probe, plan, tpu_compiler
from diffusers_tpu.planner.chips import CHIPS
from diffusers_tpu.runtime.call import step_caches
from diffusers_tpu.runtime.call.denoiser_hooks import active_hooks, inner_hooks
from diffusers_tpu.runtime.config import TPUConfig


def pipeline():
    """NucleusMoE-Image with the transformer at diffusers' defaults (parameters on ``meta``), Qwen-Image's VAE at its
    defaults; no text encoder: the calls take text states."""
    transformer = architectures.empty(lambda: diffusers.NucleusMoEImageTransformer2DModel())
    vae = architectures.empty(lambda: diffusers.AutoencoderKLQwenImage())
    for module in (transformer, vae):
        architectures.fill_random(module, torch.bfloat16, None)
    return diffusers.NucleusMoEImagePipeline(
        transformer=transformer.eval(),
        vae=vae.eval(),
        scheduler=diffusers.FlowMatchEulerDiscreteScheduler(),
        text_encoder=None,
        processor=None,
    )


def text(tokens: int, width: int, padded: int):
    """Text states of ``tokens`` positions, the last ``padded`` of them padding (as a processor pads a prompt)."""
    mask = torch.ones(1, tokens, dtype=torch.long)
    mask[:, tokens - padded :] = 0
    return torch.zeros(1, tokens, width, dtype=torch.bfloat16), mask


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chips", default="v6e-8")
    parser.add_argument("--height", type=int, default=1024)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--text-tokens", type=int, default=256, help="the prompt's, padded (the negative's: half)")
    parser.add_argument("--json")
    args = parser.parse_args()

    devices = tpu_compiler.devices(CHIPS[args.chips])
    pipe = pipeline()
    width = pipe.transformer.config.joint_attention_dim
    prompt, prompt_mask = text(args.text_tokens, width, 5)
    negative, negative_mask = text(args.text_tokens // 2, width, 3)
    keywords = dict(
        prompt_embeds=prompt,
        prompt_embeds_mask=prompt_mask,
        negative_prompt_embeds=negative,
        negative_prompt_embeds_mask=negative_mask,
        height=args.height,
        width=args.width,
        guidance_scale=4.0,
    )
    size = dict(height=args.height, width=args.width, num_frames=1, guidance_scale=4.0)
    config = TPUConfig(dtype=torch.bfloat16, text_encoder="host")
    rows = {}
    for name, cached in (("uncached", None), ("computing", True), ("reusing", False)):
        if pipe.transformer.is_cache_enabled:
            pipe.transformer.disable_cache()
        if cached is not None:
            pipe.transformer.enable_cache(diffusers.TextKVCacheConfig())
        with plan.attached(pipe, config, devices) as runtime:
            denoiser = runtime.decision.component("transformer")
            state = abstract_weights.abstract_component(denoiser, runtime.mesh, config)
            entry = runtime.denoiser_entry(denoiser.module, denoiser.rules, state=lambda: state)
            reported = abstract_weights.reported_dtype(denoiser.module, state)
            probed = call_probe.probe_denoiser_call(pipe, size, args.text_tokens, reported, runtime, keywords=keywords)
            call_args, kwargs = pytree.tree_map(lambda v: call_probe.concrete(v, 2), probed[:2])
            print(f"compiling {name} ...", flush=True)
            if cached is None:
                lowered, _ = program_figures.lowered_output_shapes(entry.whole, *call_args, **kwargs)
            else:
                cache = entry.step_cache(inner_hooks(active_hooks(denoiser.module), denoiser.module))
                kept(cache, kwargs["encoder_hidden_states"], runtime.mesh, compute=cached)
                with step_caches.batched_rows(("cond", "uncond")):
                    lowered, _ = entry.cached_program(cache).lowered(call_args, kwargs)
            rows[name] = dict(figures(lowered), mesh=dict(runtime.mesh.shape), text_tokens=args.text_tokens)
            print(json.dumps(rows[name]), flush=True)
    if args.json:
        with open(args.json, "w") as file:
            json.dump(dict(vars(args), rows=rows, versions=dict(jax=jax.__version__)), file, indent=1)


def kept(cache, text_states, mesh, compute: bool) -> None:
    """The cache's plan for one batched call: computing, or reusing every block's kept keys and values,
    ``[layers, rows, text, kv heads, head dim]``, laid out as the programs leave them (rows over dp, text over sp, heads
    over tp: measured on the 8-device CPU mesh, tests/runtime/test_mesh.py)."""
    config = cache.blocks[0].attn
    heads, dim = config.inner_kv_dim // (config.inner_dim // config.heads), config.inner_dim // config.heads
    shape = (len(cache.blocks), text_states.shape[0], text_states.shape[1], heads, dim)
    sizes, spec = dict(mesh.shape), [None, "dp", "sp", "tp", None]
    spec = [axis if axis is None or shape[i] % sizes[axis] == 0 else None for i, axis in enumerate(spec)]
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(*spec))
    stacked = jax.ShapeDtypeStruct(shape, jax.numpy.bfloat16, sharding=sharding)
    site = f"{cache.paths[0]}.*"
    cache.contexts, cache.compute = ("cond", "uncond"), compute
    cache.order = () if compute else ((site, 0), (site, 1))
    cache.inputs = [] if compute else [stacked, stacked]
    cache.key = ("text_kv", compute)


if __name__ == "__main__":
    main()
