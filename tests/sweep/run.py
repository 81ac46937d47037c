"""The parity sweep: every pipeline class with a tiny recipe (``sweep_recipes``) run on stock torch (CPU, float32)
and on JAX, on 1 device and on the 8-device mesh (dp2·sp2·tp2), compared as ``"np"`` (max-abs ≤ 1e-4; an output
beyond [0, 1], such as linear HDR, divided by its largest magnitude first), pictures as ``"pil"`` too (one level at
most on ≤ 0.1% of subpixels), a soundtrack as ``"np"``; a third call records what it compiles (nothing, once warm)
and each row how many guided steps ran the CFG pair as one batch on the mesh.

One command measures and rewrites the table that ``diffusers_tpu.supported_pipelines()`` reads and the generated
page ``docs/verified-pipelines.md``::

    python -m tests.sweep.run --write

The 1-device runs are two processes taking classes from one queue, slowest first, and the mesh runs two more
beside them (the mesh's 8 simulated CPU devices must be set before JAX starts); ``--only NAME ...`` runs
some classes, ``--devices 1|8 --out FILE`` one process. ``--sample SECONDS`` runs a part whose recorded times
add up to about that (CI's check, tests/test_sweep.py): one class of every denoiser path, then classes in an order
drawn from a key.

Over 400 lines on purpose: one run of the sweep (the comparison, the process pool, the table it writes) read in
one place.
"""

from __future__ import annotations

import argparse
import copy
import gc
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import diffusers
import jax
import numpy as np
import torch
from diffusers.image_processor import VaeImageProcessor

from diffusers_tpu import TPUConfig
from diffusers_tpu.interop import compile_accounting
from diffusers_tpu.runtime import registry, support

from .. import call_depth, xla_flags
from .recipes import RECIPES

TOLERANCE = 1e-4
MESH = {"dp": 2, "sp": 2, "tp": 2}
MESH_NAME = "dp2·sp2·tp2"
ROOT = Path(__file__).resolve().parents[2]
TABLE = ROOT / "diffusers_tpu" / "runtime" / "verified_pipelines.json"
PAGE = ROOT / "docs" / "verified-pipelines.md"


def _frames(out):
    for name in ("frames", "images", "videos", "audios"):
        if hasattr(out, name):
            return getattr(out, name)
    return out[0]


def _run(pipe, call, output_type="np", sound: list | None = None):
    """The call's frames (float32 for ``"np"``); a soundtrack it makes too (LTX-2) is appended to ``sound``."""
    torch.manual_seed(0)  # draws without the generator (``latent_dist.sample()``) come from torch's default one
    out = pipe(**copy.deepcopy(call), output_type=output_type, generator=torch.Generator().manual_seed(0))
    if sound is not None and isinstance(getattr(out, "audio", None), torch.Tensor):
        sound.append(out.audio.detach().float().cpu().numpy())
    frames = _frames(out)
    return np.asarray(frames, dtype=np.float32) if output_type == "np" else frames


def _pictures(ref) -> bool:
    """Whether a "np" output is 8-bit-able pictures (RGB or gray in [0, 1]): then "pil" is compared too."""
    return ref.ndim >= 4 and ref.shape[-1] in (1, 3) and float(ref.min()) >= 0.0 and float(ref.max()) <= 1.0


def _pil_levels(images):
    """A "pil" output (images, or videos as lists of frames) as one uint8 array."""
    if isinstance(images, (list, tuple)):
        return np.stack([_pil_levels(image) for image in images])
    array = np.asarray(images)
    if array.dtype != np.uint8:
        raise TypeError(f'output_type="pil" gave {type(images).__name__} of {array.dtype}, not 8-bit images')
    return array


def second_calls(pipe, call, ref) -> dict:
    """What the JAX pipeline gives on two more calls: ``"pil"`` (its frames made 8-bit on the device) beside stock's
    rounding of its own ``"np"`` output (diffusers' ``numpy_to_pil``, the function stock's ``"pil"`` ends in), and an
    ``"np"`` call that must compile nothing (``warm_compilations``)."""
    found = {}
    if _pictures(ref):
        try:
            frames = ref.reshape(-1, *ref.shape[-3:])
            stock = np.stack([np.asarray(image) for image in VaeImageProcessor.numpy_to_pil(frames)])
            images = _run(pipe, call, "pil")
            if _ignores_pil(images, ref):  # as stock's may (TextToVideoZero returns "np" whatever is asked):
                found["pil_as_np"] = images  # measure asks stock itself
                return found | _warm_compilations(pipe, call)
            levels = _pil_levels(images).reshape(stock.shape)
            off = np.abs(levels.astype(np.int16) - stock.astype(np.int16))
            found.update(pil_max_levels=int(off.max()), pil_levels_off=float((off > 0).mean()))
        except ValueError as error:
            if "output_type" not in str(error):  # else the pipeline's own check refused "pil" (Marigold: np, pt)
                found["pil_error"] = f"{type(error).__name__}: {str(error)[:300]}"
        except Exception as error:  # measure asks stock: the same error there is stock's behaviour, not a port's
            found["pil_error"], found["pil_raised"] = f"{type(error).__name__}: {str(error)[:300]}", error
    return found | _warm_compilations(pipe, call)


def _warm_compilations(pipe, call) -> dict:
    with compile_accounting.compile_log() as log:
        _run(pipe, call)
    return dict(warm_compilations=log.compilations)


def _ignores_pil(images, ref) -> bool:
    """A "pil" call that gave the float frames "np" gives (same shape, not 8-bit): the pipeline ignores
    ``output_type`` there, or the port failed to make its frames 8-bit; ``stock_pil`` tells which."""
    array = np.asarray(images) if not isinstance(images, (list, tuple)) or not images else None
    return array is not None and array.dtype.kind == "f" and array.shape == ref.shape


def stock_pil_fails(pipe, call, raised: Exception) -> dict:
    """Stock's own "pil" call (the pipeline back on torch), beside a JAX one that raised ``raised``: the same error
    (LDM3D's 16-bit depth maps, which this Pillow cannot make) is what stock does, and "pil" is left out."""
    pipe.to("cpu")
    try:
        _run(pipe, call, "pil")
    except Exception as error:
        if type(error) is type(raised) and str(error) == str(raised):
            return dict(pil_stock_fails=f"{type(error).__name__}: {str(error)[:300]}")
    return {}


def stock_pil(pipe, call, ours) -> dict:
    """Stock's own "pil" call (the pipeline back on torch), held against a JAX "pil" call that gave float frames:
    where stock gives float frames too, they are compared as "np" is (``pil_max_abs``); else it is an error."""
    pipe.to("cpu")
    stock = _run(pipe, call, "pil")
    if not _ignores_pil(stock, ours):
        return dict(pil_error=f'output_type="pil" gave float frames where stock gives {type(stock).__name__}')
    return dict(
        pil_ignored=True, pil_max_abs=compare(np.asarray(stock, np.float32), np.asarray(ours, np.float32))["max_abs"]
    )


def measure(name: str, devices: int) -> dict:
    """One class: its stock output, then the JAX one on ``devices`` devices; ``pipe.to("cpu")`` afterwards."""

    began = time.perf_counter()
    try:
        pipe, call = RECIPES[name]()
        pipe.set_progress_bar_config(disable=True)
    except Exception as error:
        return dict(error=f"recipe: {type(error).__name__}: {str(error)[:300]}", seconds=time.perf_counter() - began)
    sound = []
    try:
        ref = _run(pipe, call, sound=sound)
    except Exception as error:  # stock diffusers itself fails: nothing to compare
        return dict(
            error=f"stock diffusers {diffusers.__version__} fails: {type(error).__name__}: {str(error)[:300]}",
            seconds=time.perf_counter() - began,
        )
    if not np.isfinite(ref).all() or float(ref.std()) < 1e-3:  # a blank or broken video proves nothing
        return dict(
            error=f"recipe: stock's output is constant or not finite (std {float(np.nanstd(ref)):.1e})",
            seconds=time.perf_counter() - began,
        )
    try:  # no persistent compile cache: no two classes share a program, so writing them would only cost time
        pipe.to("jax", config=TPUConfig(mesh=MESH if devices > 1 else None, compile_cache_dir=False))
        with call_depth.measured(__file__) as depths:  # the project's frames between stock code and each program
            out = _run(pipe, call, sound=sound)
    except Exception as error:
        return dict(error=f"jax: {type(error).__name__}: {str(error)[:300]}", seconds=time.perf_counter() - began)
    runtime = pipe._diffusers_tpu_runtime
    found = dict(batched_steps=runtime.pairing.batched_steps if runtime.pairing else 0)  # CFG pairs run as one batch
    found["deepest_frames"] = depths.deepest
    if depths.deepest > call_depth.MOST:
        found["deepest_chain"] = " > ".join(depths.examples[depths.deepest])
    if len(sound) == 2:  # the soundtrack, compared as the frames are
        same = sound[1].shape == sound[0].shape and np.isfinite(sound[1]).all()
        found["audio_max_abs"] = float(np.abs(sound[1] - sound[0]).max()) if same else None
    if out.shape != ref.shape:
        return dict(
            error=f"output shape {out.shape} where stock gives {ref.shape}", seconds=time.perf_counter() - began
        )
    try:
        found.update(second_calls(pipe, call, ref))
        if "pil_as_np" in found:
            found.update(stock_pil(pipe, call, found.pop("pil_as_np")))
        if "pil_raised" in found and stock_pil_fails(pipe, call, found.pop("pil_raised")):
            found["pil_stock_fails"] = found.pop("pil_error")
    except Exception as error:
        return dict(
            error=f"jax, second call: {type(error).__name__}: {str(error)[:300]}", seconds=time.perf_counter() - began
        )
    return dict(compare(ref, out), **found, shape=list(ref.shape), seconds=round(time.perf_counter() - began, 1))


def compare(ref, out) -> dict:
    """``max_abs`` of two same-shaped outputs (None when either is not finite). An output beyond [0, 1] (LTX-2 HDR's
    linear light, up to ~50 after an exponential) is compared relative to its largest magnitude (``scale``):
    float32's last bit there is 50 times an image's. [0, 1] outputs are compared as they are."""
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
    """max-abs ≤ ``TOLERANCE`` (a soundtrack too); an output the pipeline rounded to 8 bits, and "pil": within one
    level on ≤ 0.1% of subpixels."""
    if result is None or result.get("max_abs") is None:
        return False
    if "audio_max_abs" in result and (result["audio_max_abs"] is None or result["audio_max_abs"] > TOLERANCE):
        return False
    if result.get("pil_ignored") and (result["pil_max_abs"] is None or result["pil_max_abs"] > TOLERANCE):
        return False  # stock ignores output_type="pil" (float frames): so must the port, with the same frames
    if "pil_error" in result or result.get("pil_max_levels", 0) > 1 or result.get("pil_levels_off", 0.0) > 1e-3:
        return False  # "pil": stock's rounding, one level at most on at most 0.1% of subpixels
    if result.get("quantized"):
        return result["max_levels"] <= 1 and result["levels_off"] <= 1e-3
    return result["max_abs"] <= TOLERANCE


def _claim(folder: str | None, name: str) -> bool:
    """True for the one process of those sharing ``folder`` that takes ``name`` (always, without a folder)."""
    if folder is None:
        return True
    try:
        os.close(os.open(os.path.join(folder, name), os.O_CREAT | os.O_EXCL))
        return True
    except FileExistsError:
        return False


def run_process(names: list[str], devices: int, out_file: str, claims: str | None = None):

    support.measured = lambda: {}  # measure every class afresh: no refusal or verdict from the committed table
    results = {}
    for name in names:
        if not _claim(claims, name):
            continue
        results[name] = measure(name, devices)
        gc.collect()  # the class's pipeline and programs go before the next class is built (no two share one)
        jax.clear_caches()
        print(f"[{devices} device(s)] {name}: {results[name]}", file=sys.stderr, flush=True)
        Path(out_file).write_text(json.dumps(results, indent=1))  # what is done survives a crash


def status_of(one: dict | None, mesh: dict | None, video: bool) -> tuple[str, str]:
    """(status, why) of a class from its two measurements."""
    ok = close_enough
    for label, result in (("1 device", one), (MESH_NAME, mesh)):
        if result is not None and "error" not in result and not ok(result):
            pil = result.get("pil_error") or (
                f"; pil: {result['pil_max_levels']} levels on {result['pil_levels_off']:.2%}"
                if "pil_max_levels" in result
                else ""
            )
            return "unsupported", f"differs from stock on {label} (max-abs {result.get('max_abs')}{pil})"
        if result is not None and result.get("error", "").startswith(("jax", "output shape")):
            return "unsupported", f"fails on {label}: {result['error']}"
    if ok(one) and ok(mesh):
        return "verified", ""
    if ok(one):
        return "verified on 1 device", "" if not video else f"not run on {MESH_NAME}"
    error = (one or {}).get("error", "no tiny recipe")
    return "untested", error


def spawn(names: list[str], devices: int, out_file: str, claims: str | None = None) -> subprocess.Popen:
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    # XLA:CPU compiling fast, as in tests/conftest.py (same float32 arithmetic; a quarter of the compile time)
    flags = env.get("XLA_FLAGS", "") + " " + " ".join(xla_flags.fast_compile(("--xla_backend", "--xla_cpu_use")))
    if devices > 1:
        flags += f" --xla_force_host_platform_device_count={devices}"
    env["XLA_FLAGS"] = flags.strip()
    env.setdefault("HF_HUB_OFFLINE", "1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))  # tests.sweep, run anywhere
    claimed = ["--claims", claims] if claims else []
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.sweep.run",
            "--devices",
            str(devices),
            "--out",
            out_file,
            *claimed,
            "--only",
            *names,
        ],
        env=env,
    )


PROCESSES = 2  # per device count: whichever kind of run finishes first leaves both cores to the other


def sweep(names: list[str]) -> dict:
    """The 1-device and the mesh processes side by side; ``{class: {"one": ..., "mesh": ...}}``."""
    recorded = _recorded()
    with tempfile.TemporaryDirectory() as folder:
        runs = []
        for devices, seconds in ((1, "seconds_1"), (8, "seconds_mesh")):
            claims = os.path.join(folder, f"claims-{devices}")
            os.makedirs(claims)
            slowest_first = sorted(names, key=lambda n: -(recorded.get(n, {}).get(seconds) or 0.0))
            runs += [
                (devices, os.path.join(folder, f"{devices}-{i}.json"), slowest_first, claims) for i in range(PROCESSES)
            ]
        processes = [spawn(order, devices, path, claims) for devices, path, order, claims in runs]
        for process in processes:
            process.wait()
        found = {1: {}, 8: {}}
        for devices, path, _, _ in runs:
            if os.path.exists(path):
                found[devices].update(json.loads(Path(path).read_text()))
    return {name: {"one": found[1].get(name), "mesh": found[8].get(name)} for name in names}


def commit_key() -> str:
    """The checkout's commit (a rerun of one commit draws the same sample), else a fixed key."""
    try:
        return subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "no-commit"


def _recorded() -> dict:
    return support.measured()  # the committed table (this process never replaces support.measured)


def estimated_seconds(names: list[str]) -> dict[str, float]:
    """Each class's share of the sweep's wall time by its recorded runs, each timed among the 2 x PROCESSES
    processes sharing two cores (a class never measured counts as a typical one)."""
    recorded = _recorded()
    known = sorted(
        r["seconds_1"] + r["seconds_mesh"] for r in recorded.values() if r.get("seconds_1") and r.get("seconds_mesh")
    )
    typical = known[len(known) // 2] if known else 60.0  # unrecorded: ~15 s of wall time a class, as measured
    both = {
        n: (recorded.get(n, {}).get("seconds_1") or 0) + (recorded.get(n, {}).get("seconds_mesh") or 0) for n in names
    }
    return {n: (both[n] or typical) / (2 * PROCESSES) for n in names}


def sample(names: list[str], seconds: float, key: str, paths: dict[str, str]) -> list[str]:
    """A part of ``names`` that the sweep runs in about ``seconds``: the first class of every denoiser path
    (``paths``: class -> path), then the others while they fit, each in an order drawn from ``key``."""
    cost = estimated_seconds(names)
    drawn = sorted(names, key=lambda n: hashlib.sha256(f"{key}:{n}".encode()).hexdigest())
    firsts = list({paths.get(n, "generic").split(":")[0]: n for n in reversed(drawn)}.values())
    chosen, spent = [], 0.0
    for name in firsts + [n for n in drawn if n not in firsts]:
        if name in firsts or spent + cost[name] <= seconds:
            chosen.append(name)
            spent += cost[name]
    return sorted(chosen)


def table(measured: dict) -> dict:
    rows = {}
    for name, result in sorted(measured.items()):
        shape = (result["one"] or result["mesh"] or {}).get("shape", [])
        video = len(shape) == 5  # [batch, frames, height, width, channels]
        status, why = status_of(result["one"], result["mesh"], video)
        rows[name] = dict(
            status=status,
            why=why,
            max_abs_1=(result["one"] or {}).get("max_abs"),
            max_abs_mesh=(result["mesh"] or {}).get("max_abs"),
            video=video,
            seconds_1=(result["one"] or {}).get("seconds"),
            seconds_mesh=(result["mesh"] or {}).get("seconds"),
            pil_levels_off_1=(result["one"] or {}).get("pil_levels_off"),
            pil_levels_off_mesh=(result["mesh"] or {}).get("pil_levels_off"),
            batched_steps_mesh=(result["mesh"] or {}).get("batched_steps"),
            warm_compilations=max((result[k] or {}).get("warm_compilations", 0) for k in ("one", "mesh")),
            deepest_frames=max((result[k] or {}).get("deepest_frames", 0) for k in ("one", "mesh")),
        )
        if any((result[k] or {}).get("quantized") for k in ("one", "mesh")):  # judged by the 8-bit rule
            rows[name].update(
                levels_off_1=(result["one"] or {}).get("levels_off"),
                levels_off_mesh=(result["mesh"] or {}).get("levels_off"),
            )
    assert set(rows) <= set(RECIPES)
    return rows


def _write_atomically(path: Path, text: str):
    temporary = path.with_name(path.name + ".partial")
    temporary.write_text(text)
    os.replace(temporary, path)


def write(rows: dict):
    """The table, then the page and README's table generated from it (each file replaced whole)."""
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
    parser.add_argument(
        "--sample",
        type=float,
        metavar="SECONDS",
        help="run a part taking about this long (every denoiser path; drawn from --key)",
    )
    parser.add_argument("--key", help="with --sample: what draws the part (default: the checkout's commit)")
    parser.add_argument("--claims", help="with --devices: a folder shared by processes that split the classes")
    args = parser.parse_args(argv)

    names = args.only or sorted(RECIPES)
    unknown = sorted(set(names) - set(RECIPES))
    if unknown:
        parser.error(f"no recipe for {unknown}; recipes: {sorted(RECIPES)}")
    if args.devices:
        run_process(names, args.devices, args.out, args.claims)
        return
    if args.sample is not None:
        names = sample(names, args.sample, args.key or commit_key(), registry.pipeline_paths())
    rows = table(sweep(names))
    for name, row in rows.items():
        print(
            f"{name:55s} {row['status']:22s} {row['max_abs_1']} {row['max_abs_mesh']} pil {row['pil_levels_off_1']} "
            f"{row['pil_levels_off_mesh']} warm {row['warm_compilations']} {row['why'][:80]}"
        )
    if args.write:
        if args.only or args.sample is not None:
            previous = json.loads(TABLE.read_text()) if TABLE.exists() else {}
            rows = {**previous, **rows}
        write(rows)


if __name__ == "__main__":
    main()
