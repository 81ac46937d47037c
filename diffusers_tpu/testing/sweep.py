"""The parity sweep: every pipeline class with a tiny recipe (``sweep_recipes``) run on stock torch (CPU, float32)
and on JAX, on 1 device and on the 8-device mesh (dp2·sp2·tp2), compared as ``"np"`` (max-abs ≤ 1e-4; an output
beyond [0, 1], such as linear HDR, divided by its largest magnitude first).

One command measures and rewrites the table that ``diffusers_tpu.supported_pipelines()`` reads and the generated
page ``docs/verified-pipelines.md``::

    python -m diffusers_tpu.testing.sweep --write

The 1-device and the mesh runs are two processes side by side (the mesh's 8 simulated CPU devices must be set
before JAX starts); ``--only NAME ...`` runs some classes, ``--devices 1|8 --out FILE`` one process.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TOLERANCE = 1e-4
MESH = {"dp": 2, "sp": 2, "tp": 2}
MESH_NAME = "dp2·sp2·tp2"
ROOT = Path(__file__).resolve().parents[2]
TABLE = Path(__file__).resolve().parents[1] / "runtime" / "verified_pipelines.json"
PAGE = ROOT / "docs" / "verified-pipelines.md"


def _frames(out):
    for name in ("frames", "images", "videos", "audios"):
        if hasattr(out, name):
            return getattr(out, name)
    return out[0]


def _run(pipe, call):
    import numpy as np
    import torch

    torch.manual_seed(0)  # draws without the generator (``latent_dist.sample()``) come from torch's default one
    out = pipe(**copy.deepcopy(call), output_type="np", generator=torch.Generator().manual_seed(0))
    return np.asarray(_frames(out), dtype=np.float32)


def measure(name: str, devices: int) -> dict:
    """One class: its stock output, then the JAX one on ``devices`` devices; ``pipe.to("cpu")`` afterwards."""
    import numpy as np

    from .. import TPUConfig
    from .sweep_recipes import RECIPES

    began = time.perf_counter()
    try:
        pipe, call = RECIPES[name]()
        pipe.set_progress_bar_config(disable=True)
    except Exception as error:
        return dict(error=f"recipe: {type(error).__name__}: {str(error)[:300]}", seconds=time.perf_counter() - began)
    try:
        ref = _run(pipe, call)
    except Exception as error:  # stock diffusers itself fails: nothing to compare
        import diffusers

        return dict(error=f"stock diffusers {diffusers.__version__} fails: {type(error).__name__}: {str(error)[:300]}",
                    seconds=time.perf_counter() - began)
    if not np.isfinite(ref).all() or float(ref.std()) < 1e-3:  # a blank or broken video proves nothing
        return dict(error=f"recipe: stock's output is constant or not finite (std {float(np.nanstd(ref)):.1e})",
                    seconds=time.perf_counter() - began)
    try:
        pipe.to("jax", config=TPUConfig(mesh=MESH if devices > 1 else None))
        out = _run(pipe, call)
        pipe.to("cpu")
    except Exception as error:
        return dict(error=f"jax: {type(error).__name__}: {str(error)[:300]}", seconds=time.perf_counter() - began)
    if out.shape != ref.shape:
        return dict(error=f"output shape {out.shape} where stock gives {ref.shape}",
                    seconds=time.perf_counter() - began)
    return dict(compare(ref, out), shape=list(ref.shape), seconds=round(time.perf_counter() - began, 1))


def compare(ref, out) -> dict:
    """``max_abs`` of two same-shaped outputs (None when either is not finite). An output beyond [0, 1] (LTX-2 HDR's
    linear light, up to ~50 after an exponential) is compared relative to its largest magnitude (``scale``):
    float32's last bit there is 50 times an image's. [0, 1] outputs are compared as they are."""
    import numpy as np

    if not (np.isfinite(ref).all() and np.isfinite(out).all()):
        return dict(max_abs=None, finite=False)
    scale = max(1.0, float(np.abs(ref).max()))
    result = dict(max_abs=float(np.abs(out - ref).max()) / scale, finite=True)
    if scale > 1.0:
        result["scale"] = scale
    levels = ref * 255.0
    if scale == 1.0 and np.abs(levels - np.round(levels)).max() < 1e-3:
        # the pipeline itself rounded its frames to 8 bits (Cosmos' guardrail sees uint8 frames): a last-bit
        # difference before the rounding moves a subpixel by one level, so the "pil" rule applies
        off = np.abs(np.round(out * 255.0) - np.round(levels))
        result.update(quantized=True, max_levels=int(off.max()), levels_off=float((off > 0).mean()))
    return result


def close_enough(result: dict | None) -> bool:
    """max-abs ≤ ``TOLERANCE``; an output the pipeline rounded to 8 bits: within one level on ≤ 0.1% of subpixels."""
    if result is None or result.get("max_abs") is None:
        return False
    if result.get("quantized"):
        return result["max_levels"] <= 1 and result["levels_off"] <= 1e-3
    return result["max_abs"] <= TOLERANCE


def run_process(names: list[str], devices: int, out_file: str):
    from ..runtime import support

    support.measured = lambda: {}  # measure every class afresh: no refusal or verdict from the committed table
    results = {}
    for name in names:
        results[name] = measure(name, devices)
        print(f"[{devices} device(s)] {name}: {results[name]}", file=sys.stderr, flush=True)
        Path(out_file).write_text(json.dumps(results, indent=1))  # what is done survives a crash


def status_of(one: dict | None, mesh: dict | None, video: bool) -> tuple[str, str]:
    """(status, why) of a class from its two measurements."""
    ok = close_enough
    for label, result in (("1 device", one), (MESH_NAME, mesh)):
        if result is not None and "error" not in result and not ok(result):
            return "unsupported", f"differs from stock on {label} (max-abs {result.get('max_abs')})"
        if result is not None and result.get("error", "").startswith(("jax", "output shape")):
            return "unsupported", f"fails on {label}: {result['error']}"
    if ok(one) and ok(mesh):
        return "verified", ""
    if ok(one):
        return "verified on 1 device", "" if not video else f"not run on {MESH_NAME}"
    error = (one or {}).get("error", "no tiny recipe")
    return "untested", error


def spawn(names: list[str], devices: int, out_file: str) -> subprocess.Popen:
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    flags = env.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=0"
    if devices > 1:
        flags += f" --xla_force_host_platform_device_count={devices}"
    env["XLA_FLAGS"] = flags.strip()
    env.setdefault("HF_HUB_OFFLINE", "1")
    return subprocess.Popen([sys.executable, "-m", "diffusers_tpu.testing.sweep", "--devices", str(devices),
                             "--out", out_file, "--only", *names], env=env)


def sweep(names: list[str]) -> dict:
    """Both processes side by side; ``{class: {"one": ..., "mesh": ...}}``."""
    with tempfile.TemporaryDirectory() as folder:
        files = {devices: os.path.join(folder, f"{devices}.json") for devices in (1, 8)}
        processes = [spawn(names, devices, path) for devices, path in files.items()]
        for process in processes:
            process.wait()
        found = {devices: json.loads(Path(path).read_text()) if os.path.exists(path) else {}
                 for devices, path in files.items()}
    return {name: {"one": found[1].get(name), "mesh": found[8].get(name)} for name in names}


def table(measured: dict) -> dict:
    from .sweep_recipes import RECIPES

    rows = {}
    for name, result in sorted(measured.items()):
        shape = (result["one"] or result["mesh"] or {}).get("shape", [])
        video = len(shape) == 5  # [batch, frames, height, width, channels]
        status, why = status_of(result["one"], result["mesh"], video)
        rows[name] = dict(status=status, why=why, max_abs_1=(result["one"] or {}).get("max_abs"),
                          max_abs_mesh=(result["mesh"] or {}).get("max_abs"), video=video)
        if any((result[k] or {}).get("quantized") for k in ("one", "mesh")):  # judged by the 8-bit rule
            rows[name].update(levels_off_1=(result["one"] or {}).get("levels_off"),
                              levels_off_mesh=(result["mesh"] or {}).get("levels_off"))
    assert set(rows) <= set(RECIPES)
    return rows


def _write_atomically(path: Path, text: str):
    temporary = path.with_name(path.name + ".partial")
    temporary.write_text(text)
    os.replace(temporary, path)


def write(rows: dict):
    """The table, then the page and README's table generated from it (each file replaced whole)."""
    from ..runtime import support

    _write_atomically(TABLE, json.dumps(rows, indent=1, sort_keys=True) + "\n")
    support.measured.cache_clear()
    _write_atomically(PAGE, support.support_page())
    readme = ROOT / "README.md"
    _write_atomically(readme, support.replace_readme_table(readme.read_text()))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true", help="run every recipe and rewrite the table and the page")
    parser.add_argument("--only", nargs="+", help="pipeline class names")
    parser.add_argument("--devices", type=int, choices=(1, 8), help="run in this process on this many devices")
    parser.add_argument("--out", help="with --devices: the JSON file to write")
    args = parser.parse_args(argv)
    from .sweep_recipes import RECIPES

    names = args.only or sorted(RECIPES)
    unknown = sorted(set(names) - set(RECIPES))
    if unknown:
        parser.error(f"no recipe for {unknown}; recipes: {sorted(RECIPES)}")
    if args.devices:
        run_process(names, args.devices, args.out)
        return
    rows = table(sweep(names))
    for name, row in rows.items():
        print(f"{name:55s} {row['status']:22s} {row['max_abs_1']} {row['max_abs_mesh']} {row['why'][:80]}")
    if args.write:
        if args.only:
            previous = json.loads(TABLE.read_text()) if TABLE.exists() else {}
            rows = {**previous, **rows}
        write(rows)


if __name__ == "__main__":
    main()
