"""Prompt-following accuracy of a demo pipeline: generate each caption, read the video back with ``scenes.analyse``.

    python -m diffusers_tpu.demo.evaluate [--platform torch|cpu|tpu|...] [--mesh 2,1,4] [--dtype bfloat16]
                                          [--quantize int8]

Reports, over the training captions and the held-out colour/direction pairs (never seen in training), the share of
videos whose colour, shape and direction are right (each, and all three), the share of videos that keep a clean
background (no blob or smear away from the shape: ``scenes.BLOB_PIXELS``), and how clean the background is (the mean
share of the pixels away from the shape within ``scenes.CLEAN_LEVELS`` of the background colour). Seeds 0..N-1 per
caption.
"""

from __future__ import annotations

import argparse
import json

import torch

import diffusers_tpu

from ..interop.backend import device_for
from ..interop.mesh_axes import mesh_arg
from ..runtime.files import outputs
from . import CALL, load_pipeline, scenes


def readings(pipe, items, seeds, call=None) -> list[dict]:
    """One row per (caption, seed): what was asked and what the analyser read."""
    call = {**CALL, **(call or {})}
    rows = []
    for colour, shape, direction in items:
        prompt = scenes.caption(colour, shape, direction)
        for seed in seeds:
            frames = pipe(prompt, output_type="np", generator=torch.Generator().manual_seed(seed), **call).frames[0]
            read = scenes.analyse((frames * 255).round().clip(0, 255).astype("uint8"))
            rows.append(
                dict(
                    prompt=prompt,
                    seed=seed,
                    colour=read.colour,
                    shape=read.shape,
                    direction=read.direction,
                    colour_ok=read.colour == colour,
                    shape_ok=read.shape == shape,
                    direction_ok=read.direction == direction,
                    travel=read.travel,
                    fit=read.fit,
                    clean=read.clean,
                    blob=read.blob,
                    clean_background=read.clean_background,
                )
            )
    return rows


def summary(rows: list[dict]) -> dict:
    count = len(rows)
    return dict(
        videos=count,
        colour=sum(r["colour_ok"] for r in rows) / count,
        shape=sum(r["shape_ok"] for r in rows) / count,
        direction=sum(r["direction_ok"] for r in rows) / count,
        all=sum(r["colour_ok"] and r["shape_ok"] and r["direction_ok"] for r in rows) / count,
        background=sum(r["clean"] for r in rows) / count,
        clean_backgrounds=sum(r["clean_background"] for r in rows) / count,
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m diffusers_tpu.demo.evaluate")
    parser.add_argument("--model", default=None, help="a demo pipeline folder (default: the shipped model)")
    parser.add_argument("--platform", default="torch", choices=("torch", "cpu", "gpu", "tpu", "jax"))
    parser.add_argument("--mesh", type=mesh_arg)
    parser.add_argument("--attention", default=None)
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--quantize", choices=("int8", "fp8"), help="store the transformer's linear weights so (JAX)")
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--json", help="also write the rows and summaries here")
    args = parser.parse_args(argv)
    if args.quantize and args.platform == "torch":
        parser.error("--quantize needs a JAX platform (--platform cpu, tpu, ...)")
    pipe = load_pipeline(args.model) if args.model else load_pipeline()
    device = device_for(args.platform)
    if device != "torch":
        dtype = torch.bfloat16 if args.dtype == "bfloat16" else None
        pipe.to(
            device,
            config=diffusers_tpu.TPUConfig(
                mesh=args.mesh, attention=args.attention, dtype=dtype, quantize=args.quantize
            ),
        )
    elif args.dtype == "bfloat16":
        pipe.transformer.to(torch.bfloat16)
    report = {}
    for name, held_out in (("training captions", False), ("held-out pairs", True)):
        rows = readings(pipe, scenes.captions(held_out), range(args.seeds))
        report[name] = dict(summary(rows), rows=rows)
        print(
            f"{name}: "
            + ", ".join(f"{k} {v:.0%}" if isinstance(v, float) else f"{k} {v}" for k, v in summary(rows).items()),
            flush=True,
        )
    if args.json:
        outputs.write_text(args.json, json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
