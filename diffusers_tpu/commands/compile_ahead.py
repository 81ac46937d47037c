"""``diffusers-tpu compile``: every program a call runs, built ahead into a folder (``runtime.program_store``) that a
later run loads with ``TPUConfig(programs=DIR)`` instead of compiling.

- ``--chips v6e-8`` (any TPU slice ``plan`` knows): on any machine, no TPU attached. The programs are the ones
  ``pipe.to("tpu")`` decides on that slice (``runtime.decision``, read by ``plan`` too: weights abstract, mesh and
  shardings as placed), lowered as the runtime lowers them and compiled by the TPU compiler; each is written under
  the key the runtime computes on the TPU VM (the same module text, versions, devices in mesh order, flags).
- ``--local``: for this machine's own devices (CPU or GPU): the pipeline placed with ``pipe.to("jax")`` and warmed up
  without running the model (``warm_up(execute=False)``), every program written as it is built. Needs real weights
  (a folder or a tiny model; ``--arch`` builds random ones).

The small eager programs between them (scheduler steps, guidance) are not stored: JAX's persistent cache keeps those.
"""

from __future__ import annotations

import json
import os
import time

import torch

from ..interop import program_figures
from ..planner import architectures, tpu_compiler
from ..planner.chips import CHIPS
from ..runtime.attach import warmup
from ..runtime.config import TPUConfig
from ..runtime.files import outputs
from ..runtime.programs import program_store
from .arguments import load_pipeline, pipeline_to_compile
from .program_table import every_program, render


def main(args) -> int:
    if args.json:
        outputs.check_destination(args.json, what="--json")
    dtype = torch.bfloat16 if args.dtype == "bfloat16" else None
    store = program_store.ProgramStore(args.output)
    if not store.writable:
        raise ValueError(f"--output {args.output}: cannot write there; name a folder you can write.")
    size = dict(height=args.height, width=args.width, num_frames=args.frames, guidance_scale=args.guidance)
    start = time.perf_counter()
    if args.local:
        result = _local(args, dtype, size)
    else:
        result = _for_slice(args, dtype, size, store)
    result.update(wall_seconds=round(time.perf_counter() - start, 1), output=args.output)
    written = sorted(name for name in os.listdir(args.output) if name.endswith(".program"))
    result["files"] = len(written)
    print(
        render(result)
        if "programs" in result
        else f"built and wrote the programs of a call in {result['wall_seconds']} s"
    )
    print(f"{len(written)} programs in {args.output}; load them with TPUConfig(programs={args.output!r})")
    if args.json:
        outputs.write_text(args.json, json.dumps(result, indent=1))
    return 0


def _for_slice(args, dtype, size, store) -> dict:
    tpu_compiler.require("diffusers-tpu compile --chips")
    chip = CHIPS[args.chips]
    devices = tpu_compiler.devices(chip)
    pipe = pipeline_to_compile(args, dtype)  # weights abstract: a program's key does not read them
    config = TPUConfig(mesh=args.mesh, dtype=dtype, vae_compile=args.vae_compile, compile_cache_dir=False)

    def build_and_write(lowered) -> dict:  # each build as the runtime makes it, written under the runtime's key
        options = getattr(lowered, "options", {})
        began = time.perf_counter()
        compiled = lowered.compile()
        seconds = time.perf_counter() - began
        saved = store.save(lowered, options, compiled)
        report = program_figures.memory_report(compiled)  # what plan reads of every program
        return dict(
            report,
            compile_seconds=round(seconds, 1),
            generated_code_bytes=compiled.memory_analysis().generated_code_size_in_bytes,
            tier=getattr(lowered, "tier", "full"),
            saved=saved,
        )

    head, rows = every_program(
        args, pipe, size, config, devices, build_and_write, f"building every program of a call into {args.output}"
    )
    return {
        **head,
        "programs": [
            {"program": name, **{k: a[k] for k in ("compile_seconds", "generated_code_bytes", "temp_bytes", "saved")}}
            for name, a in rows
        ],
        "compile_seconds_sum": round(sum(a["compile_seconds"] for _, a in rows), 1),
    }


def _local(args, dtype, size) -> dict:
    pipe = architectures.build(args.arch, dtype or torch.float32) if args.arch else load_pipeline(args.model)
    # compiled afresh (JAX's persistent cache off): a program loaded from that cache cannot be written again
    config = TPUConfig(
        mesh=args.mesh, dtype=dtype, vae_compile=args.vae_compile, programs=args.output, compile_cache_dir=False
    )
    pipe.to("jax", config=config)
    call = {k: v for k, v in size.items() if k != "guidance_scale"}
    warmed = warmup.warm_up(
        pipe,
        [call],
        workers=args.workers,
        prompt="a programs-ahead warm-up",
        negative_prompt="",
        guidance_scale=args.guidance,
        num_inference_steps=args.steps,
        output_type="pil",
    )
    return {"model": args.arch or args.model, "local": True, "programs_compiled": warmed["programs"]}
