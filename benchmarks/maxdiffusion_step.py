"""This project's Wan step beside Google's maxdiffusion Wan transformer, compiled by the same TPU compiler, same shapes.

A benchmark, not a test (minutes of compiling per row). It needs a checkout of the public repository
``AI-Hypercomputer/maxdiffusion`` and its JAX dependencies (flax, optax, orbax-checkpoint, einops, chex, aqtp; its
tensorboard and Google Cloud imports are stubbed here: nothing is written or uploaded). No TPU is needed.

    git clone https://github.com/AI-Hypercomputer/maxdiffusion ~/maxdiffusion
    pip freeze | grep -E '^(jax|jaxlib|numpy|scipy|ml.dtypes|opt.einsum|typing.extensions)==' > keep.txt
    pip install --target ~/mdlibs -c keep.txt flax optax orbax-checkpoint chex aqtp einops pyyaml
    # this environment's own stay in use:
    rm -rf ~/mdlibs/{jax,jaxlib,numpy,scipy,ml_dtypes,opt_einsum,typing_extensions}*
    PYTHONPATH=~/mdlibs python benchmarks/maxdiffusion_step.py --maxdiffusion ~/maxdiffusion \\
        --arch Wan2.1-1.3B --chips v6e-4 --height 480 --width 832 --frames 81 --fully-sharded-weights

Both programs are one guided denoising step (the CFG pair as a batch of 2) of every transformer block, bf16, compiled
for the slice's topology with no TPU attached: this project's exactly as ``plan`` compiles it (the runtime's own
program, ``TPUConfig`` defaults or ``--mesh``), maxdiffusion's as its ``create_sharded_logical_transformer`` builds the
model (its yaml config, its mesh rules, splash attention), called as its pipeline calls it. Each column is read from the
compiled program with the same counter (``planner.hlo_stats``): memory per device, bytes and FLOPs per layer (the layer
loop's body), collectives per layer, copies, code size, compile seconds.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import time
import types

GB = 1e9


def _stub_unneeded_imports() -> None:
    """maxdiffusion imports tensorboardX and google.cloud.storage at module level; compiling needs neither."""
    for name in ("tensorboardX", "tensorboardX.writer"):
        module = sys.modules.setdefault(name, types.ModuleType(name))
        module.SummaryWriter = object
        module.writer = module
    try:
        import google.cloud.storage  # noqa: F401  (installed: nothing to stub)
    except ImportError:
        try:
            import google  # a namespace package (protobuf's) may exist: extend it, never replace it
        except ImportError:
            google = sys.modules.setdefault("google", types.ModuleType("google"))
        cloud = sys.modules.setdefault("google.cloud", types.ModuleType("google.cloud"))
        storage = types.ModuleType("google.cloud.storage")
        storage.Client = object
        google.cloud, cloud.storage = cloud, storage
        sys.modules["google.cloud.storage"] = storage


def _summarise(compiled, seconds: float) -> dict:
    from diffusers_tpu.planner import hlo_stats

    report = hlo_stats.summary(compiled, seconds=seconds)
    loop = max(report["hlo"]["loops"], key=lambda entry: entry["instructions"], default=None)
    report["layer"] = loop  # one iteration of the layer loop (None when the blocks are unrolled)
    return report


def ours(arch: str, chip: str, size: dict, mesh: dict | None, fully_sharded: bool = False) -> dict:
    import torch

    from diffusers_tpu.planner import architectures, plan, tpu_compiler
    from diffusers_tpu.runtime.config import TPUConfig

    pipe = architectures.build(arch, torch.bfloat16, weights=False)
    config = TPUConfig(dtype=torch.bfloat16, mesh=mesh, compile_cache_dir=False, fully_sharded_weights=fully_sharded)

    def analyse(lowered):
        start = time.perf_counter()
        compiled = lowered.compile()
        return _summarise(compiled, time.perf_counter() - start)

    report = plan.start_denoiser_memory(
        pipe, dict(size, guidance_scale=5.0), config, tpu_compiler.devices(chip), 512, analyse=analyse
    )()
    return dict(report["passes"][0], mesh=report["mesh"])


def theirs(checkout: str, arch: str, chip: str, size: dict, overrides: list[str]) -> dict:
    """maxdiffusion's Wan transformer step compiled for ``chip`` (its own config, mesh rules and attention)."""
    import jax
    import jax.numpy as jnp

    from diffusers_tpu.planner import tpu_compiler

    sys.path.insert(0, os.path.join(checkout, "src"))
    _stub_unneeded_imports()
    import flax.linen as nn
    from flax import nnx
    from flax.linen import partitioning as nn_partitioning
    from maxdiffusion import max_utils as mu
    from maxdiffusion import pyconfig
    from maxdiffusion.models.wan.transformers.transformer_wan import WanModel

    devices = tpu_compiler.devices(chip)
    name = {"Wan2.1-1.3B": "base_wan_1_3b.yml", "Wan2.1-14B": "base_wan_14b.yml"}[arch]
    argv = [
        None,
        os.path.join(checkout, "src", "maxdiffusion", "configs", name),
        "hardware=tpu",
        f"height={size['height']}",
        f"width={size['width']}",
        f"num_frames={size['num_frames']}",
        *overrides,
    ]
    with contextlib.redirect_stdout(io.StringIO()):  # its config printout, a line per parameter
        pyconfig.initialize(argv, unittest=True)
        config = pyconfig.config
        mesh = jax.sharding.Mesh(mu.create_device_mesh(config, devices, logging=False), config.mesh_axes)

    wan = {
        "Wan2.1-1.3B": dict(num_attention_heads=12, ffn_dim=8960, num_layers=30),
        "Wan2.1-14B": dict(num_attention_heads=40, ffn_dim=13824, num_layers=40),
    }[arch]
    # the keyword arguments its create_sharded_logical_transformer passes (pipelines/wan/wan_pipeline.py)
    model_config = dict(
        wan,
        patch_size=(1, 2, 2),
        attention_head_dim=128,
        in_channels=16,
        out_channels=16,
        text_dim=4096,
        freq_dim=256,
        cross_attn_norm=True,
        qk_norm="rms_norm_across_heads",
        eps=1e-6,
        mesh=mesh,
        dtype=config.activations_dtype,
        weights_dtype=config.weights_dtype,
        attention=config.attention,
        precision=mu.get_precision(config),
        flash_block_sizes=mu.get_flash_block_sizes(config),
        remat_policy=config.remat_policy,
        names_which_can_be_saved=config.names_which_can_be_saved,
        names_which_can_be_offloaded=config.names_which_can_be_offloaded,
        flash_min_seq_length=config.flash_min_seq_length,
        dropout=config.dropout,
        mask_padding_tokens=config.mask_padding_tokens,
        scan_layers=config.scan_layers,
        enable_jax_named_scopes=config.enable_jax_named_scopes,
        attention_config={
            "use_base2_exp": config.use_base2_exp,
            "use_experimental_scheduler": config.use_experimental_scheduler,
            "ulysses_shards": getattr(config, "ulysses_shards", -1),
            "ulysses_attention_chunks": getattr(config, "ulysses_attention_chunks", 1),
        },
    )
    with mesh, nn_partitioning.axis_rules(config.logical_axis_rules):
        model = nnx.eval_shape(lambda: WanModel(rngs=nnx.Rngs(0), **model_config))
        graphdef, state, rest = nnx.split(model, nnx.Param, ...)
        specs = nnx.get_partition_spec(state)
        shardings = nn.logical_to_mesh_sharding(specs, mesh, config.logical_axis_rules)
        abstract_state = jax.tree_util.tree_map(
            lambda value, sharding: jax.ShapeDtypeStruct(value.shape, value.dtype, sharding=sharding), state, shardings
        )
        frames = (size["num_frames"] - 1) // 4 + 1
        batch_spec = nn.logical_to_mesh_sharding(
            jax.sharding.PartitionSpec("activation_batch"), mesh, config.logical_axis_rules
        )
        latents = jax.ShapeDtypeStruct(
            (2, 16, frames, size["height"] // 8, size["width"] // 8),
            jnp.bfloat16,
            sharding=jax.sharding.NamedSharding(mesh, batch_spec.spec),
        )
        timestep = jax.ShapeDtypeStruct((2,), jnp.int32, sharding=jax.sharding.NamedSharding(mesh, batch_spec.spec))
        text = jax.ShapeDtypeStruct(
            (2, 512, 4096), jnp.bfloat16, sharding=jax.sharding.NamedSharding(mesh, batch_spec.spec)
        )

        def step(params, latents_, timestep_, text_):
            merged = nnx.merge(graphdef, params, rest)
            # as its pipeline's transformer_forward_pass calls it (the CFG pair as one batch of 2)
            return merged(hidden_states=latents_, timestep=timestep_, encoder_hidden_states=text_)

        start = time.perf_counter()
        compiled = jax.jit(step).lower(abstract_state, latents, timestep, text).compile()
        report = _summarise(compiled, time.perf_counter() - start)
    return dict(report, mesh=dict(zip(config.mesh_axes, mesh.devices.shape)))


ROWS = (
    ("mesh", lambda r: str(r["mesh"])),
    ("weights + inputs per device (GB)", lambda r: f"{r['argument_bytes'] / GB:.2f}"),
    ("temporaries per device (GB)", lambda r: f"{r['temp_bytes'] / GB:.2f}"),
    ("non-attention FLOPs per device, step", lambda r: f"{r['hlo']['total']['flops']:.4g}"),
    ("bytes read+written per layer (GB)", lambda r: f"{r['layer']['bytes'] / GB:.2f}" if r["layer"] else "unrolled"),
    ("bytes read+written per step (GB)", lambda r: f"{r['hlo']['total']['bytes'] / GB:.1f}"),
    (
        "collective bytes per layer (MB)",
        lambda r: f"{sum(r['layer']['collective_bytes'].values()) / 1e6:.0f}" if r["layer"] else "unrolled",
    ),
    ("collectives per layer", lambda r: str(r["layer"]["collectives"]) if r["layer"] else "unrolled"),
    ("copies per layer", lambda r: str(r["layer"]["copies"]) if r["layer"] else "unrolled"),
    ("copies per step", lambda r: str(r["hlo"]["total"]["copies"])),
    (
        "non-attention custom calls per layer",
        lambda r: (
            str(sum(n for t, n in r["layer"]["custom_calls"].items() if t != "tpu_custom_call")) if r["layer"] else "-"
        ),
    ),
    ("generated code (MB)", lambda r: f"{r['generated_code_bytes'] / 1e6:.1f}"),
    ("compile seconds", lambda r: f"{r['compile_seconds']:.0f}"),
)


def table(columns: dict) -> str:
    """A markdown table: a row per ``ROWS`` entry, a column per ``{name: report}``."""
    lines = ["| per device, one guided step | " + " | ".join(columns) + " |", "|---|" + "---:|" * len(columns)]
    lines += [
        f"| {label} | " + " | ".join(value(report) for report in columns.values()) + " |" for label, value in ROWS
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--maxdiffusion", required=True, help="a checkout of AI-Hypercomputer/maxdiffusion")
    parser.add_argument("--arch", default="Wan2.1-1.3B", choices=("Wan2.1-1.3B", "Wan2.1-14B"))
    parser.add_argument("--chips", default="v6e-4")
    parser.add_argument("--height", type=int, default=480)
    parser.add_argument("--width", type=int, default=832)
    parser.add_argument("--frames", type=int, default=81)
    parser.add_argument("--mesh", help="this project's dp,sp,tp (default: pipe.to's)")
    parser.add_argument(
        "--fully-sharded-weights",
        action="store_true",
        help="a third column: this project's step with TPUConfig(fully_sharded_weights=True)",
    )
    parser.add_argument(
        "--theirs",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a maxdiffusion config override, e.g. ici_data_parallelism=2 (repeatable)",
    )
    parser.add_argument("--json", help="write both reports here")
    args = parser.parse_args(argv)
    if not os.path.isdir(os.path.join(args.maxdiffusion, "src", "maxdiffusion")):
        parser.error(
            f"--maxdiffusion {args.maxdiffusion}: not a maxdiffusion checkout (no src/maxdiffusion); "
            "git clone https://github.com/AI-Hypercomputer/maxdiffusion"
        )
    from diffusers_tpu.planner import tpu_compiler

    tpu_compiler.require("maxdiffusion_compare")
    size = dict(height=args.height, width=args.width, num_frames=args.frames)
    mesh = dict(zip(("dp", "sp", "tp"), map(int, args.mesh.split(",")))) if args.mesh else None
    print(
        f"{args.arch} {args.height}x{args.width}x{args.frames} on {args.chips}: compiling this project's step ...",
        flush=True,
    )
    columns = {"diffusers_tpu": ours(args.arch, args.chips, size, mesh)}
    if args.fully_sharded_weights:
        print("compiling this project's step with fully sharded weights ...", flush=True)
        columns["diffusers_tpu, fully sharded weights"] = ours(args.arch, args.chips, size, mesh, True)
    print("compiling maxdiffusion's ...", flush=True)
    columns["maxdiffusion"] = theirs(args.maxdiffusion, args.arch, args.chips, size, args.theirs)
    print(table(columns))
    if args.json:
        from diffusers_tpu.runtime.files import outputs

        outputs.write_text(args.json, json.dumps(columns, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
