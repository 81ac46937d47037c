"""The attention kernels' work per 128 x 128 score tile, per TPU unit, from Mosaic's LLO (``planner.kernel_work``):
the project's exp2 kernel beside JAX's splash kernel (its MHA kernel, no mask; at the exp2 kernel's block sizes
where splash accepts them, and at splash's own defaults), for the real models' per-device attention calls.

    python benchmarks/kernel_work.py                                  # every real call, v5e and v6e
    python benchmarks/kernel_work.py --calls wan2.1-1.3b-480p-self --chips v6e-1 --ops

Operations issued, not scheduled bundles: a static proxy for the work, not a time. Figures in BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import sys

from diffusers_tpu.planner import kernel_work, tpu_compiler

COLUMNS = ("mxu", "vector", "transcendental", "load/store", "cross-lane")


def rows(calls: list[str], chips: list[str]) -> list[kernel_work.KernelWork]:
    specs = [
        (kernel, kernel_work.REAL_CALLS[name], chip)
        for name in calls
        for chip in chips
        for kernel in kernel_work.KERNELS
    ]
    return kernel_work.count(specs)


def markdown(results: list[kernel_work.KernelWork], names: dict) -> str:
    lines = [
        "| call | chip | kernel | blocks | grid | " + " | ".join(COLUMNS) + " |",
        "|---|---|---|---|---|" + "---:|" * len(COLUMNS),
    ]
    for result in results:
        head = f"| {names[result.call]} | {result.chip} | {result.kernel} | {'/'.join(map(str, result.blocks))} |"
        if result.refused:
            lines.append(f"{head} refused | {result.refused} |" + " |" * (len(COLUMNS) - 1))
            continue
        grid = "×".join(map(str, result.grid))
        lines.append(f"{head} {grid} | " + " | ".join(f"{result.per_tile[c]:.1f}" for c in COLUMNS) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--calls", nargs="+", default=list(kernel_work.REAL_CALLS), choices=list(kernel_work.REAL_CALLS)
    )
    parser.add_argument("--chips", nargs="+", default=["v5e-1", "v6e-1"])
    parser.add_argument("--ops", action="store_true", help="also list every LLO op per tile")
    parser.add_argument("--json", help="write the rows to this file")
    args = parser.parse_args(argv)
    try:
        results = rows(args.calls, args.chips)
    except tpu_compiler.Unavailable as error:  # no libtpu: what to install, not a traceback
        print(error, file=sys.stderr)
        return 2
    names = {call: name for name, call in kernel_work.REAL_CALLS.items()}
    print(markdown(results, names))
    if args.ops:
        for result in results:
            print(f"\n{names[result.call]} {result.chip} {result.kernel}: {result.ops_per_tile}")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump([r.as_dict() for r in results], handle, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
