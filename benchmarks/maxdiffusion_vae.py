"""This project's Wan VAE decode beside maxdiffusion's, compiled by the same TPU compiler for the same slice and shape.

A benchmark (minutes of compiling), not a test; no TPU needed. It needs a checkout of the public repository
``AI-Hypercomputer/maxdiffusion`` and flax (installed apart, keeping this environment's JAX):

    git clone https://github.com/AI-Hypercomputer/maxdiffusion ~/maxdiffusion
    pip freeze | grep -E '^(jax|jaxlib|numpy|scipy|ml.dtypes|opt.einsum|typing.extensions)==' > keep.txt
    pip install --target ~/mdlibs -c keep.txt flax einops chex
    rm -rf ~/mdlibs/{jax,jaxlib,numpy,scipy,ml_dtypes,opt_einsum,typing_extensions}*
    PYTHONPATH=~/mdlibs python benchmarks/maxdiffusion_vae.py --maxdiffusion ~/maxdiffusion \\
        --chips v6e-8 --height 720 --width 1280 --frames 81

Rows: this project's decode programs as ``diffusers-tpu ready`` compiles them (the runtime's own, abstract weights,
``vae_compile`` quick and full), and maxdiffusion's whole decode (one program: frames 0 and 1 unrolled, a scan over
the rest, uint8 frames out, as its ``vae_decode_pass``) in its default setting (float32 weights and activations,
its default matmul precision) and its fast recipe's (``run_wan_fast_inference.sh``: bfloat16 weights and activations,
``JAX_DEFAULT_MATMUL_PRECISION=bfloat16``), each on its own VAE mesh over every device (``vae_spatial``).
"""

from __future__ import annotations

import argparse
import importlib.machinery
import json
import os
import sys
import time
import types


def _stub_unneeded_imports() -> None:
    """maxdiffusion imports tensorboardX at module level; compiling needs none of it."""
    for name in ("tensorboardX", "tensorboardX.writer"):
        module = sys.modules.setdefault(name, types.ModuleType(name))
        module.__spec__ = importlib.machinery.ModuleSpec(name, None)  # (accelerate looks packages up by spec)
        module.SummaryWriter = object
        module.writer = module


def _row(name, compiled, seconds) -> dict:
    analysis = compiled.memory_analysis()
    return {
        "program": name,
        "compile_seconds": round(seconds, 1),
        "generated_code_bytes": analysis.generated_code_size_in_bytes,
        "temp_bytes": analysis.temp_size_in_bytes,
    }


def theirs(devices, latent_shape, recipe: str) -> dict:
    """maxdiffusion's Wan 2.1 VAE decode, compiled for ``devices`` (abstract weights)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import linen as nn
    from flax import nnx
    from flax.linen import partitioning as nn_partitioning
    from jax.sharding import Mesh, NamedSharding
    from maxdiffusion.models.wan.autoencoder_kl_wan import AutoencoderKLWan, AutoencoderKLWanCache

    fast = recipe == "fast"
    dtype = jnp.bfloat16 if fast else jnp.float32
    mesh = Mesh(np.array(devices).reshape(1, len(devices)), ("redundant", "vae_spatial"))
    rules = (  # base_wan_14b.yml's vae_logical_axis_rules
        ("activation_batch", "redundant"),
        ("activation_length", "vae_spatial"),
        ("activation_heads", None),
        ("activation_kv_length", None),
        ("embed", None),
        ("heads", None),
        ("norm", None),
        ("conv_batch", "redundant"),
        ("out_channels", "vae_spatial"),
        ("conv_out", "vae_spatial"),
        ("conv_in", "vae_spatial"),
    )

    def create(rngs):
        return AutoencoderKLWan(rngs=rngs, mesh=mesh, dtype=dtype, weights_dtype=dtype, vae_decode_chunk=1)

    with mesh, nn_partitioning.axis_rules(rules):
        vae = nnx.eval_shape(create, rngs=nnx.Rngs(0))
        graphdef, state, rest = nnx.split(vae, nnx.Param, ...)
        specs = nnx.get_partition_spec(state)
        shardings = nn.logical_to_mesh_sharding(specs, mesh, rules)
        state = jax.tree.map(
            lambda leaf, sharding: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding), state, shardings
        )
        replicated = NamedSharding(mesh, jax.sharding.PartitionSpec())
        rest = jax.tree.map(lambda leaf: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=replicated), rest)
        batch, channels, frames, height, width = latent_shape
        latents = jax.ShapeDtypeStruct((batch, frames, height, width, channels), dtype, sharding=replicated)

        def decode_pass(state, rest, latents):  # as maxdiffusion's vae_decode_pass
            model = nnx.merge(graphdef, state, rest)
            video = model.decode(latents, AutoencoderKLWanCache(model), return_dict=False)[0]
            return (jnp.clip(video / 2.0 + 0.5, 0.0, 1.0) * 255.0).astype(jnp.uint8)

        precision = "bfloat16" if fast else jax.config.jax_default_matmul_precision
        with jax.default_matmul_precision(precision):
            start = time.perf_counter()
            lowered = jax.jit(decode_pass).lower(state, rest, latents)
            compiled = lowered.compile()
    return _row(f"maxdiffusion decode ({recipe})", compiled, time.perf_counter() - start)


def ours(chip: str, size: dict, vae_compile: str) -> list[dict]:
    import torch

    from diffusers_tpu.commands.program_table import programs_of
    from diffusers_tpu.commands.ready import timed
    from diffusers_tpu.planner import architectures, program_memory, tpu_compiler
    from diffusers_tpu.planner.plan import attached
    from diffusers_tpu.runtime.config import TPUConfig

    pipe = architectures.build("Wan2.1-14B", torch.bfloat16, weights=False)  # the VAE is Wan 2.1's at any size
    config = TPUConfig(dtype=torch.bfloat16, text_encoder="host", vae_compile=vae_compile, compile_cache_dir=False)
    devices = tpu_compiler.devices(chip)
    latent = (1, 16, (size["num_frames"] - 1) // 4 + 1, size["height"] // 8, size["width"] // 8)
    with attached(pipe, config, devices) as runtime:
        submit = program_memory.vae_submit(lambda low: program_memory.compiled_now(low, timed), config, runtime)
        report = program_memory.vae_decode_started(pipe, config, runtime, latent, 1, submit)()
    rows = programs_of({"passes": [], "vae_decode": report})
    return [
        {
            "program": f"diffusers_tpu {name}",
            **{k: a[k] for k in ("compile_seconds", "generated_code_bytes", "temp_bytes")},
        }
        for name, a in rows
    ]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--maxdiffusion", required=True, help="a checkout of AI-Hypercomputer/maxdiffusion")
    parser.add_argument("--chips", default="v6e-8")
    parser.add_argument("--height", type=int, default=720)
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--frames", type=int, default=81)
    parser.add_argument("--ours", default="quick,full", help="vae_compile modes of this project to compile")
    parser.add_argument("--theirs", default="default,fast", help="maxdiffusion settings to compile")
    parser.add_argument("--json", help="write the rows to this file")
    args = parser.parse_args(argv)
    sys.path.insert(0, os.path.join(args.maxdiffusion, "src"))
    _stub_unneeded_imports()
    from diffusers_tpu.planner import tpu_compiler

    size = dict(height=args.height, width=args.width, num_frames=args.frames)
    latent = (1, 16, (args.frames - 1) // 4 + 1, args.height // 8, args.width // 8)
    rows = []
    for mode in filter(None, args.ours.split(",")):
        rows += ours(args.chips, size, mode)
        print(json.dumps(rows[-1]), flush=True)
    for recipe in filter(None, args.theirs.split(",")):
        rows.append(theirs(tpu_compiler.devices(args.chips), latent, recipe))
        print(json.dumps(rows[-1]), flush=True)
    print(f"Wan2.1 VAE decode, {args.height}x{args.width}x{args.frames} on {args.chips}, one compile at a time:")
    for row in rows:
        print(
            f"  {row['program']:<52}{row['compile_seconds']:>8.1f} s{row['generated_code_bytes'] / 1e6:>9.1f} MB code"
            f"{row['temp_bytes'] / 2**30:>8.2f} GiB temporaries"
        )
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(rows, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
