"""Step caches' whole-step programs for a real-size model on a TPU slice, compiled by the TPU compiler (no TPU needed).

    python benchmarks/cache_programs.py --arch Wan2.1-14B --chips v6e-8 --height 720 --width 1280 --frames 81

A benchmark, not a test (a minute or more of compiling per program). For one guided step (the CFG pair as one batch
over dp, as the runtime runs it) it compiles, exactly as the runtime builds them (``Denoiser.cached_program``, abstract
weights and cache state): the uncached step; FirstBlockCache's first-step program and its steady program (head block,
then ``lax.cond``: the other blocks, or the kept tail residual); MagCache's computing and skipping programs;
TaylorSeer's (on every block's self-attention, first order, bf16 factors) computing and predicting programs; Pyramid
Attention Broadcast's (self-attention) computing and reusing programs, one pass each (it runs the pair as two calls);
SeaCache's computing, skipping and extrapolating programs, one pass each (its pair too; its indicator's FFTs run op
by op before the call, outside these programs); FasterCache's (on a pipeline that batches the pair itself:
``--arch CogVideoX1.5-5B --only none,faster``) computing program (the pair) and approximating one (the conditional
half, every self-attention extrapolated; its denoiser hook's FFTs run op by op after the call, outside it).
Each row is read with ``planner.hlo_stats`` (FLOPs with loop bodies times their trip counts; of a conditional the
larger branch), memory per device, compile seconds and the compiler's own estimate (``optimal_seconds``; libtpu gives
none for a program holding its own ``ConcatBitcast`` calls, as a real-size full-effort step does). CPU numbers never
enter: these are the compiler's figures, not run times.
"""

from __future__ import annotations

import argparse
import json
import time
import types

import jax
import torch
from diffusers import (
    FasterCacheConfig,
    FirstBlockCacheConfig,
    MagCacheConfig,
    PyramidAttentionBroadcastConfig,
    SeaCacheConfig,
    TaylorSeerCacheConfig,
)

from diffusers_tpu.interop import program_figures
from diffusers_tpu.interop.torch_private import pytree
from diffusers_tpu.planner import abstract_weights, architectures, call_probe, hlo_stats, plan, tpu_compiler
from diffusers_tpu.planner.chips import CHIPS
from diffusers_tpu.runtime.call import step_caches
from diffusers_tpu.runtime.call.denoiser_hooks import active_hooks, inner_hooks
from diffusers_tpu.runtime.config import TPUConfig


def figures(lowered) -> dict:
    start = time.perf_counter()
    try:
        compiled = lowered.compile()
    except jax.errors.JaxRuntimeError as error:  # the compiler's own verdict: the program does not fit
        if "RESOURCE_EXHAUSTED" not in str(error):
            raise
        return {"fits": False, "compiler": str(error).splitlines()[0][:300]}
    summary = hlo_stats.summary(compiled, seconds=time.perf_counter() - start)
    hlo = summary["hlo"]
    loop = max(hlo["loops"], key=lambda found: found["instructions"], default=None)
    return {
        "flops": hlo["total"]["flops"],
        "attention_flops": hlo["total"]["attention_flops"],
        "bytes": hlo["total"]["bytes"],
        "per_layer_flops": loop["flops"] + loop["attention_flops"] if loop else None,
        "peak_bytes_per_device": summary.get("peak_bytes"),
        **{k: summary.get(k) for k in ("argument_bytes", "output_bytes", "alias_bytes", "temp_bytes")},
        "compile_seconds": round(time.perf_counter() - start, 1),
        "optimal_seconds": summary.get("xla_cost", {}).get("optimal_seconds"),
    }


def _abstract_state(cache, kind: str, hidden: jax.ShapeDtypeStruct, decisions: tuple):
    """The cache's key and state inputs for one program: ``decisions`` per context ("first" / "kept" for
    FirstBlockCache, "compute" / "skip" for MagCache), the kept tensors abstract, shaped as a block's hidden states."""
    # one context's rows as the programs leave them (``denoiser._spread_kept_state``): tokens over dp·sp, features tp
    sharding = jax.sharding.NamedSharding(hidden.sharding.mesh, jax.sharding.PartitionSpec(None, ("dp", "sp"), "tp"))
    rows = jax.ShapeDtypeStruct((hidden.shape[0] // len(decisions), *hidden.shape[1:]), hidden.dtype, sharding=sharding)
    cache.contexts = ("cond", "uncond")[: len(decisions)]
    if kind in ("taylor", "pab"):
        return _abstract_layer_state(cache, kind, hidden, decisions)
    if kind == "fbc":
        cache.kept = tuple(None if d == "first" else False for d in decisions)
        cache.inputs = [rows, rows] * sum(d == "kept" for d in decisions)
    elif kind == "sea":  # "skip": the latest residual; "extrapolate": the last two and the steps' scale
        cache.compute = tuple(d == "compute" for d in decisions)
        cache.extrapolate = [None if d == "compute" else d == "extrapolate" for d in decisions]
        scale = jax.ShapeDtypeStruct((), jax.numpy.float32)
        cache.inputs = [
            x for d in decisions if d != "compute" for x in ([rows, rows, scale] if d != "skip" else [rows])
        ]
    else:
        cache.compute = tuple(d == "compute" for d in decisions)
        cache.inputs = [rows] * sum(d == "skip" for d in decisions)
    cache.key = (kind, cache.contexts, decisions)


def _abstract_layer_state(cache, kind: str, hidden: jax.ShapeDtypeStruct, decisions: tuple) -> None:
    """TaylorSeer's / PAB's inputs: per site (one hooked attention module per block) the kept arrays stacked over the
    layers, ``[layers, rows, tokens, features]`` laid out as ``denoiser._spread_kept_state`` leaves them."""
    spec = jax.sharding.PartitionSpec(None, None, ("dp", "sp"), "tp")
    rows = hidden.shape[0] // len(decisions)
    stacked = {
        site: jax.ShapeDtypeStruct(
            (cache.layers[site], rows, *hidden.shape[1:]),
            hidden.dtype,
            sharding=jax.sharding.NamedSharding(hidden.sharding.mesh, spec),
        )
        for site in cache.sites
    }
    if kind == "pab":  # one pass: compute, or reuse every site's kept output
        cache.modes = [d == "compute" for d in decisions] * len(cache.sites)
        cache.keys = [] if decisions[0] == "compute" else [(site, 0) for site in cache.sites]
        cache.inputs = [stacked[site] for site, _ in cache.keys]
        for hook in cache.found:
            hook.state.cache = torch.empty(0)  # stands for the kept output: one tensor (read for its structure)
    else:  # steady computing: order 0 kept, orders 0 and 1 made; predicting: orders 0 and 1 read
        orders = 1 if decisions[0] == "compute" else 2
        state = types.SimpleNamespace(
            module_dtypes=(torch.bfloat16,), is_inactive=False, max_order=1, taylor_factors_dtype=torch.bfloat16
        )
        cache.states = [[state] * len(cache.found) for _ in decisions]
        cache.modes = [d == "compute" for d in decisions]
        cache.had, cache.inactive = [True] * len(decisions), {site: False for site in cache.sites}
        cache.keys = [(c, site, 0, k) for c in range(len(decisions)) for site in cache.sites for k in range(orders)]
        scalar = jax.ShapeDtypeStruct((), jax.numpy.float32) if orders == 1 else jax.ShapeDtypeStruct((2,), "float32")
        cache.inputs = [scalar] * len(decisions) + [stacked[site] for _, site, _, _ in cache.keys]
        cache.donated = len(cache.keys) if decisions[0] == "compute" else 0  # the old factors, replaced
    cache.key = (kind, decisions)


def _faster_state(cache, decision: str, module, kwargs: dict, dtype, mesh) -> None:
    """FasterCache's state for one call of a pipeline that batches the pair itself (CogVideoX): "compute" the whole
    batch (every attention layer computed, the conditional half kept), "approximate" the conditional half (every
    layer extrapolated from its last two kept outputs: video and text, ``[layers, 1, tokens, features]`` each)."""
    config, hidden = module.config, kwargs["hidden_states"]  # [batch, frames, channels, height, width]
    frames = hidden.shape[1] // (config.patch_size_t or 1)
    video = frames * (hidden.shape[3] // config.patch_size) * (hidden.shape[4] // config.patch_size)
    inner = config.num_attention_heads * config.attention_head_dim
    approximate = decision == "approximate"
    cache.skips = cache.approximates = [approximate] * len(cache.sites)
    cache.batches = [2 if approximate else None] * len(cache.sites)
    cache.call_shapes, cache.keys, cache.inputs = (), [], []
    for hook in cache.found:  # stock's state after a whole-batch call: two kept outputs, (video, text)
        hook.state.batch_size, hook.state.cache = 2, [None, (torch.empty(0), torch.empty(0))]
    cache.states = [hook.state for hook in cache.found]
    if approximate:
        leaves = [(1, video, inner), (1, kwargs["encoder_hidden_states"].shape[1], inner)]
        for site in cache.sites:
            layers = cache.layers[site]
            for name in ("t2", "t"):
                for index, shape in enumerate(leaves):
                    cache.keys.append((site, name, index))
                    cache.inputs.append(_kept(mesh, (layers, *shape), dtype))
            for index in range(len(leaves)):
                cache.keys.append((site, "w", index))
                cache.inputs.append(jax.ShapeDtypeStruct((layers,), jax.numpy.float32))
    cache.key = ("faster", decision)


def _kept(mesh, shape: tuple, dtype) -> jax.ShapeDtypeStruct:
    """A kept stack as ``denoiser._spread_kept_state`` leaves it: tokens over dp·sp, features over tp (an axis that
    does not divide its dim dropped)."""
    sizes = dict(mesh.shape)
    spec = [None, None, ("dp", "sp"), "tp"]
    divides = [
        e is None or shape[i] % (sizes[e] if isinstance(e, str) else sizes["dp"] * sizes["sp"]) == 0
        for i, e in enumerate(spec)
    ]
    spec = [e if ok else None for e, ok in zip(spec, divides)]
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(*spec))
    return jax.ShapeDtypeStruct(shape, jax.numpy.dtype(str(dtype).split(".")[-1]), sharding=sharding)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="Wan2.1-14B")
    parser.add_argument("--chips", default="v6e-8")
    parser.add_argument("--height", type=int, default=720)
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--frames", type=int, default=81)
    parser.add_argument("--text-tokens", type=int, default=512)
    parser.add_argument("--json")
    parser.add_argument("--only", help="these caches only, comma-separated: none,fbc,mag,sea,taylor,faster,pab")
    args = parser.parse_args()

    devices = tpu_compiler.devices(CHIPS[args.chips])
    pipe = architectures.build(args.arch, torch.bfloat16, weights=False)
    config = TPUConfig(dtype=torch.bfloat16, text_encoder="host")
    size = dict(height=args.height, width=args.width, num_frames=args.frames, guidance_scale=5.0)
    rows = {}
    for kind, cache_config, programs in (
        (None, None, [("uncached", None)]),
        ("fbc", FirstBlockCacheConfig(threshold=0.05), [("first step", ("first", "first")), ("steady", ("kept",) * 2)]),
        (
            "mag",
            MagCacheConfig(mag_ratios=[1.0] * 50, num_inference_steps=50),
            [("computing", ("compute",) * 2), ("skipping", ("skip",) * 2)],
        ),
        (
            "sea",
            SeaCacheConfig(),
            [("computing", ("compute",) * 2), ("skipping", ("skip",) * 2), ("extrapolating", ("extrapolate",) * 2)],
        ),
        (
            "taylor",
            TaylorSeerCacheConfig(cache_identifiers=[r"blocks\.\d+\.attn1"]),
            [("computing", ("compute",) * 2), ("predicting", ("predict",) * 2)],
        ),
        (
            "faster",  # CogVideoX (a pipeline that batches the pair itself: FasterCache's case)
            FasterCacheConfig(current_timestep_callback=lambda: 500, attention_weight_callback=lambda _: 0.5),
            [("computing (the pair)", "compute"), ("approximating (the conditional half)", "approximate")],
        ),
        (
            "pab",
            PyramidAttentionBroadcastConfig(
                spatial_attention_block_skip_range=2, current_timestep_callback=lambda: 500
            ),
            [("computing (one pass)", ("compute",)), ("reusing (one pass)", ("reuse",))],
        ),
    ):
        if args.only and (kind or "none") not in args.only.split(","):
            continue
        if pipe.transformer.is_cache_enabled:
            pipe.transformer.disable_cache()
        if cache_config is not None:
            pipe.transformer.enable_cache(cache_config)
        with plan.attached(pipe, config, devices) as runtime:
            denoiser = runtime.decision.component("transformer")
            state = abstract_weights.abstract_component(denoiser, runtime.mesh, config)
            entry = runtime.denoiser_entry(denoiser.module, denoiser.rules, state=lambda: state)
            reported = abstract_weights.reported_dtype(denoiser.module, state)
            call_args, kwargs, guided = call_probe.probe_denoiser_call(pipe, size, args.text_tokens, reported, runtime)
            batch = 2 if runtime.pairing is not None and guided and kind not in ("pab", "faster") else 1
            probed = call_args, kwargs
            call_args, kwargs = pytree.tree_map(lambda v: call_probe.concrete(v, batch), probed)
            mesh = dict(runtime.mesh.shape)
            for name, decisions in programs:
                print(f"compiling {kind or 'no cache'}: {name} ...", flush=True)
                if kind is None:
                    lowered, _ = program_figures.lowered_output_shapes(entry.whole, *call_args, **kwargs)
                elif kind == "faster":  # the skipped unconditional half: the conditional rows only
                    half = decisions == "approximate"
                    call = pytree.tree_map(lambda v: _rows(call_probe.concrete(v, 1), half), probed)
                    cache = entry.step_cache(_inner_hooks(denoiser.module))
                    _faster_state(cache, decisions, denoiser.module, call[1], reported, runtime.mesh)
                    lowered, _ = entry.cached_program(cache).lowered(*call)
                else:
                    cache = entry.step_cache(_inner_hooks(denoiser.module))
                    tokens = _block_hidden(denoiser.module, pipe, size, batch, reported, runtime.mesh)
                    _abstract_state(cache, kind, tokens, decisions)
                    with step_caches.batched_rows(cache.contexts):
                        lowered, _ = entry.cached_program(cache).lowered(call_args, kwargs)
                rows[f"{kind or 'none'}: {name}"] = dict(figures(lowered), mesh=mesh, batch=batch)
                print(json.dumps(rows[f"{kind or 'none'}: {name}"]), flush=True)
    if args.json:
        with open(args.json, "w") as file:
            json.dump(dict(vars(args), rows=rows, versions=dict(jax=jax.__version__)), file, indent=1)


def _rows(value, half: bool):
    """A probed argument of a pipeline that batches the pair itself, or its conditional half (FasterCache's skip)."""
    if not half or not isinstance(value, torch.Tensor) or not value.ndim:
        return value
    return value[value.shape[0] // 2 :]


def _inner_hooks(module) -> dict:
    return inner_hooks(active_hooks(module), module)


def _block_hidden(module, pipe, size, batch, dtype, mesh) -> jax.ShapeDtypeStruct:
    """A block's hidden states for the call: [batch, tokens, inner dim] (Wan: latent frames x patches)."""
    config = module.config
    scale = pipe.vae_scale_factor_spatial
    frames = (size["num_frames"] - 1) // pipe.vae_scale_factor_temporal + 1
    p_t, p_h, p_w = config.patch_size
    tokens = frames // p_t * (size["height"] // scale // p_h) * (size["width"] // scale // p_w)
    inner = config.num_attention_heads * config.attention_head_dim
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("dp", "sp"))
    return jax.ShapeDtypeStruct((batch, tokens, inner), jax.numpy.dtype(str(dtype).split(".")[-1]), sharding=sharding)


if __name__ == "__main__":
    main()
