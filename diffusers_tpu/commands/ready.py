"""``diffusers-tpu ready``: how long a first call waits for its programs — every program compiled for a TPU slice by
the TPU compiler, on this machine, no TPU attached.

The programs are the runtime's own, lowered as ``plan`` lowers them (abstract weights, the mesh ``pipe.to`` builds):
the denoiser step (every pass a guided call makes), every VAE decode program, built as ``TPUConfig.vae_compile`` says
(a tiered program: both builds), and the text encoders when they run on the devices. They compile at once on
``--workers`` threads (XLA compiles without the GIL), as ``warm_up`` builds them. Each row: compile seconds, generated
code, temporaries per device, the TPU compiler's own run-time estimate where it gives one; then their sum and the
wall time. Not compiled here: the small eager programs between
them (scheduler steps, guidance, postprocessing; tens of them, milliseconds each, BENCHMARKS.md "First call").
"""

from __future__ import annotations

import json
import time

import torch

from ..planner import compiler_estimate, hlo_stats, tpu_compiler
from ..planner.chips import CHIPS
from ..runtime.config import TPUConfig
from ..runtime.files import outputs
from .arguments import pipeline_to_compile
from .program_table import every_program, render


def timed(lowered) -> dict:
    """Compile ``lowered`` (as its build says: a ``program_builds.BuildOf`` carries its options) and read it back; a
    program the TPU compiler refuses (over the chip's memory) is a row saying so."""
    start = time.perf_counter()
    try:
        compiled = lowered.compile()
    except Exception as error:  # noqa: BLE001 (a refusal is this row's verdict; anything else raises)
        reason = tpu_compiler.refusal(error)
        if reason is None:
            raise
        seconds = round(time.perf_counter() - start, 1)
        empty = dict(peak_bytes=0, temp_bytes=0, generated_code_bytes=0, argument_bytes=0, output_bytes=0)
        return dict(empty, compile_seconds=seconds, refused=reason, tier=getattr(lowered, "tier", "full"))
    report = hlo_stats.summary(compiled, seconds=time.perf_counter() - start)
    report["tier"] = getattr(lowered, "tier", "full")
    return report


def main(args) -> int:
    tpu_compiler.require("diffusers-tpu ready")  # --chips, --arch/--model: checked before loading (``parser.check``)
    if args.json:
        outputs.check_destination(args.json, what="--json")
    chip = CHIPS[args.chips]
    devices = tpu_compiler.devices(chip)
    dtype = torch.bfloat16 if args.dtype == "bfloat16" else None
    pipe = pipeline_to_compile(args, dtype)
    if args.vae_tiling:
        pipe.vae.enable_tiling()  # the decode a call runs after pipe.vae.enable_tiling(): per tile
    config = TPUConfig(
        mesh=args.mesh,
        dtype=dtype,
        text_encoder=args.text_encoder,
        vae_compile=args.vae_compile,
        weights_in_host_memory=args.weights_in_host_memory,
        compile_cache_dir=False,  # cold: nothing remembered
    )
    size = dict(height=args.height, width=args.width, num_frames=args.frames, guidance_scale=args.guidance)
    start = time.perf_counter()
    head, rows = every_program(
        args, pipe, size, config, devices, timed, "compiling every program of a first call with the TPU compiler"
    )
    wall = time.perf_counter() - start
    result = {
        **head,
        "programs": [
            {
                "program": name,
                "compile_seconds": analysis.get("compile_seconds"),
                "generated_code_bytes": analysis["generated_code_bytes"],
                "temp_bytes": analysis["temp_bytes"],
                "refused": analysis.get("refused"),
                "compiler_seconds": compiler_estimate.reported(analysis.get("xla_cost")),
                "has_loops": bool((analysis.get("hlo") or {}).get("loops")),
            }
            for name, analysis in rows
        ],
        "compile_seconds_sum": round(sum(a.get("compile_seconds") or 0 for _, a in rows), 1),
        "wall_seconds": round(wall, 1),
    }
    print(render(result))
    if args.json:
        outputs.write_text(args.json, json.dumps(result, indent=1))
    return 0
