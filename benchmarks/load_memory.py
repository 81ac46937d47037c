"""Host memory while loading a checkpoint onto the devices: the stock route (``from_pretrained`` then ``.to``) against
sharded loading (``diffusers_tpu.from_pretrained``). Figures in BENCHMARKS.md.

    python benchmarks/load_memory.py write DIR --arch Wan2.1-1.3B   # a real-size random-weight checkpoint
    python benchmarks/load_memory.py compare DIR                    # both routes, each in a fresh process

On CPU the simulated devices' buffers live in host memory too, so each route reports its peak RSS minus the RSS
before loading minus the bytes the device arrays hold at the end (``host overhead``): what a TPU host would need
beyond the model's shards. Sampled every 2 ms.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time

import diffusers
import jax
import torch

import diffusers_tpu
from diffusers_tpu.planner import architectures
from diffusers_tpu.testing import tiny


def write(folder: str, arch: str, shard_size: str) -> None:
    """The real-size denoiser of ``arch`` with random bfloat16 weights, with the tiny Wan text encoder and VAE."""

    spec = architectures.ARCHITECTURES[arch]
    transformer = architectures.empty(lambda: diffusers.WanTransformer3DModel(**spec["transformer"]))
    architectures.fill_random(transformer, torch.bfloat16, torch.Generator().manual_seed(0))
    components = dict(tiny.wan_pipeline("wan").components, transformer=transformer.eval())
    diffusers.WanPipeline(**components).save_pretrained(folder, max_shard_size=shard_size)


def _rss() -> int:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def measure(folder: str, route: str, mesh: dict) -> dict:

    config = diffusers_tpu.TPUConfig(mesh=mesh)
    baseline, peak, running = _rss(), [0], [True]

    def sample():
        while running[0]:
            peak[0] = max(peak[0], _rss())
            time.sleep(0.002)

    thread = threading.Thread(target=sample, daemon=True)
    start = time.perf_counter()
    thread.start()
    if route == "stock":
        pipe = diffusers.WanPipeline.from_pretrained(folder, dtype=torch.bfloat16).to("jax", config=config)
    else:
        pipe = diffusers_tpu.from_pretrained(folder, device="jax", config=config, dtype=torch.bfloat16)
    running[0] = False
    thread.join()
    seconds = time.perf_counter() - start
    device = sum(s.data.nbytes for a in jax.live_arrays() for s in a.addressable_shards)
    largest = max(p.nbytes for p in pipe.transformer.parameters())
    model = sum(p.nbytes for p in pipe.transformer.parameters())
    gib = 2**30
    return dict(
        route=route,
        devices=len(jax.devices()),
        mesh=mesh,
        seconds=round(seconds, 1),
        host_overhead_gib=round((peak[0] - baseline - device) / gib, 3),
        peak_rss_gib=round(peak[0] / gib, 3),
        device_gib=round(device / gib, 3),
        model_gib=round(model / gib, 3),
        largest_tensor_gib=round(largest / gib, 3),
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/load_memory.py")
    parser.add_argument("command", choices=("write", "compare", "measure"))
    parser.add_argument("folder")
    parser.add_argument("--arch", default="Wan2.1-1.3B")
    parser.add_argument("--shard-size", default="1GB")
    parser.add_argument("--route", choices=("stock", "sharded"), default="sharded")
    parser.add_argument("--devices", type=int, default=8)
    args = parser.parse_args(argv)
    mesh = {"dp": 2, "sp": 1, "tp": args.devices // 2}
    if args.command == "write":
        write(args.folder, args.arch, args.shard_size)
    elif args.command == "measure":
        print("RESULT " + json.dumps(measure(args.folder, args.route, mesh)), flush=True)
    else:
        env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={args.devices}")
        for route in ("stock", "sharded"):
            out = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "measure",
                    args.folder,
                    "--route",
                    route,
                    "--devices",
                    str(args.devices),
                ],
                env=env,
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            print(next(line for line in out.splitlines() if line.startswith("RESULT "))[len("RESULT ") :], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
