"""diffusers' own pipeline tests, run where they are (a diffusers checkout), on stock torch CPU and on the JAX
device: per test, the stock result, the JAX result and the reason. The table in docs/conformance.md comes from it.

    git clone --depth 1 -b v0.40.0 https://github.com/huggingface/diffusers /tmp/diffusers
    python benchmarks/diffusers_conformance.py /tmp/diffusers                    # every supported family's files
    python benchmarks/diffusers_conformance.py /tmp/diffusers --files wan/test_wan.py --devices cpu jax jax-mesh

Offline: Hub-only test models are answered by ``benchmarks/diffusers_standins.py`` (a pytest plugin). The tests run
against the *installed* diffusers unless the checkout has ``src/diffusers`` (its ``tests/conftest.py`` puts ``src``
first on the path); the header names the version each run imported. ``jax-mesh`` is the JAX device with 8 simulated
host devices (``pipe.to("jax")`` shards over all of them). Each (file, device) runs in its own process;
``--reports DIR`` keeps each run's JUnit report there and reads a kept one instead of running it again (a long run
resumes; a later ``--devices cpu jax-mesh`` reuses the stock column).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ElementTree
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# the pipeline test folders of every family the project supports (tests/pipelines/<folder>)
FAMILIES = (
    "wan",
    "cogvideo",
    "hunyuan_video",
    "hunyuan_video1_5",
    "ltx",
    "ltx2",
    "skyreels_v2",
    "flux",
    "qwenimage",
    "z_image",
    "latte",
    "mochi",
    "easyanimate",
    "stable_diffusion",
    "stable_diffusion_xl",
    "stable_video_diffusion",
    "animatediff",
)
# read by huggingface_hub and transformers when they are imported: a Hub id without a stand-in fails at once (no
# retries against a network that is not there)
OFFLINE = dict(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
DEVICES = {
    "cpu": dict(DIFFUSERS_TEST_DEVICE="cpu", DIFFUSERS_CONFORMANCE_BACKEND="cpu"),
    "jax": dict(DIFFUSERS_TEST_DEVICE="jax", DIFFUSERS_CONFORMANCE_BACKEND="jax"),
    "jax-mesh": dict(
        DIFFUSERS_TEST_DEVICE="jax",
        DIFFUSERS_CONFORMANCE_BACKEND="jax",
        XLA_FLAGS="--xla_force_host_platform_device_count=8",
    ),
}


def test_files(checkout: Path, chosen: list[str] | None) -> list[Path]:
    pipelines = checkout / "tests" / "pipelines"
    if not pipelines.is_dir():
        raise SystemExit(f"{checkout} is not a diffusers checkout: no tests/pipelines folder")
    if chosen:
        files = [pipelines / name for name in chosen]
        missing = [str(f) for f in files if not f.exists()]
        if missing:
            raise SystemExit(f"no such test file: {', '.join(missing)}")
        return files
    return [f for family in FAMILIES for f in sorted((pipelines / family).glob("test_*.py"))]


def kept_report(reports: Path | None, label: str, device: str, extra: list[str]) -> Path | None:
    """Where ``--reports`` keeps one (file, device) run's report; a ``-k`` selection is part of the name."""
    if reports is None:
        return None
    selection = "." + hashlib.sha256(" ".join(extra).encode()).hexdigest()[:8] if extra else ""
    return reports / f"{label.replace('/', '__')}.{device}{selection}.xml"


def run(
    checkout: Path,
    file: Path,
    device: str,
    extra: list[str],
    timeout: float,
    keep: Path | None = None,
    workers: int = 1,
) -> dict:
    """``{test id: (outcome, reason)}`` of one file on one device, from pytest's JUnit report (``keep``'s, when a
    previous run left it there; a run that gives one leaves it there). ``workers`` > 1: pytest-xdist's processes
    (the results are the same; not part of a kept report's name)."""
    label = file.relative_to(checkout / "tests" / "pipelines")
    if keep is not None and keep.exists():
        print(f"  {label} on {device}: kept report {keep}", flush=True)
        return parse(keep)
    with tempfile.TemporaryDirectory() as scratch:
        report = Path(scratch) / "report.xml"
        env = {
            **os.environ,
            **DEVICES[device],
            **OFFLINE,
            # a checkout's own diffusers first for every device: the JAX plugin imports diffusers before the
            # checkout's conftest puts ``src`` on the path, and would otherwise test the installed one
            "PYTHONPATH": os.pathsep.join([*_source(checkout), str(REPO), os.environ.get("PYTHONPATH", "")]),
        }
        command = [
            sys.executable,
            "-m",
            "pytest",
            str(file.relative_to(checkout)),
            "-p",
            "benchmarks.diffusers_standins",
        ]
        command += ["-p", "no:cacheprovider", "-o", "addopts=", "-q", f"--junitxml={report}", *extra]
        command += ["-n", str(workers)] if workers > 1 else []
        print(f"  {label} on {device} ...", flush=True)
        try:
            done = subprocess.run(command, cwd=checkout, env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"(file)": ("error", f"timed out after {timeout:.0f} s")}
        if not report.exists():
            tail = (done.stdout + done.stderr).strip().splitlines()[-1:] or ["no output"]
            return {"(file)": ("error", f"pytest exited {done.returncode}: {tail[0][:200]}")}
        results = parse(report)
        if keep is not None:  # written whole or not at all: an interrupted run is never read back as done
            keep.parent.mkdir(parents=True, exist_ok=True)
            write(keep, [report.read_text()])
        return results


def _source(checkout: Path) -> list[str]:
    return [str(checkout / "src")] if (checkout / "src" / "diffusers").is_dir() else []


def parse(report: Path) -> dict:
    results = {}
    for case in ElementTree.parse(report).getroot().iter("testcase"):
        owner = case.get("classname", "").rsplit(".", 1)[-1]  # a test class, or the module of a plain function
        name = f"{owner}::{case.get('name')}" if owner[:1].isupper() else case.get("name")
        outcome, reason = "passed", ""
        for tag in ("failure", "error", "skipped"):
            found = case.find(tag)
            if found is not None:
                outcome = {"failure": "failed"}.get(tag, tag)
                reason = (found.get("message") or found.text or "").strip().splitlines()
                raised = [line[1:].strip() for line in (found.text or "").splitlines() if line.startswith("E ")]
                if reason == ["collection failure"] and raised:  # say why: a missing test dependency, say
                    reason = raised[-1:]
                reason = reason[0][:240] if reason else ""
                break
        results[name] = (outcome, reason)
    return results


def table(per_file: dict, devices: list[str]) -> list[str]:
    lines = ["| test | " + " | ".join(devices) + " | reason (first device that differs from cpu) |"]
    lines.append("|---|" + "---|" * len(devices) + "---|")
    for file, results in per_file.items():
        names = sorted({name for result in results.values() for name in result})
        for name in names:
            outcomes = [results[d].get(name, ("—", "")) for d in devices]
            stock = outcomes[0][0]
            reason = next(
                (r for (o, r) in outcomes[1:] if o != stock and r), outcomes[0][1] if stock != "passed" else ""
            )
            cells = " | ".join(o for o, _ in outcomes)
            lines.append(f"| {file}::{name} | {cells} | {reason.replace('|', '/')} |")
    return lines


def summary(per_file: dict, devices: list[str]) -> list[str]:
    """Per JAX device: the tests that pass on stock cpu and not there; the tests stock skips on cpu (most need an
    accelerator) that fail there; and how many of those it skips too (their own conditions: CUDA-only, nightly)."""
    lines = []
    for device in devices[1:]:
        rows = [
            (f"{file}::{name}", outcome, *results[device].get(name, ("missing", "")))
            for file, results in per_file.items()
            for name, (outcome, _) in results["cpu"].items()
        ]
        regressed = [(n, r) for n, stock, got, r in rows if stock == "passed" and got != "passed"]
        failing = [(n, r) for n, stock, got, r in rows if stock == "skipped" and got in ("failed", "error", "missing")]
        skipped = sum(stock == got == "skipped" for _, stock, got, _ in rows)
        lines.append(f"{device}: {len(regressed)} tests that pass on stock cpu do not pass here")
        lines += [f"  {name}: {reason}" for name, reason in regressed]
        lines.append(f"{device}: {len(failing)} tests that stock skips on cpu fail here ({skipped} skipped here too)")
        lines += [f"  {name}: {reason}" for name, reason in failing]
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkout", type=Path, help="a diffusers checkout (its tests/ folder is what runs)")
    parser.add_argument("--files", nargs="*", help="test files under tests/pipelines (default: every supported family)")
    parser.add_argument("--devices", nargs="*", default=["cpu", "jax"], choices=list(DEVICES))
    parser.add_argument("--markdown", type=Path, help="also write the table here (atomically)")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per (file, device) run")
    parser.add_argument("-k", dest="keyword", help="only the tests pytest's -k expression selects")
    parser.add_argument("--reports", type=Path, help="keep each run's JUnit report here; reuse those kept")
    parser.add_argument("--workers", type=int, default=1, help="pytest-xdist processes per run (each file's tests)")
    args = parser.parse_args(argv)
    if args.workers < 1:
        parser.error(f"--workers {args.workers}: give 1 or more processes")
    if args.workers > 1 and importlib.util.find_spec("xdist") is None:
        parser.error("--workers needs pytest-xdist (pip install pytest-xdist, or -e '.[test]'); or leave it at 1")
    devices = ["cpu", *[d for d in args.devices if d != "cpu"]]
    checkout = args.checkout.resolve()
    if (checkout / "src" / "diffusers").is_dir():
        print(
            f"note: {checkout}/src/diffusers is what runs on every device, not the installed diffusers (the "
            "checkout's tests/conftest.py puts it first; see each run's header; remove src/ to test the installed one)"
        )
    per_file = {}
    extra = ["-k", args.keyword] if args.keyword else []
    for file in test_files(checkout, args.files):
        label = str(file.relative_to(checkout / "tests" / "pipelines"))
        per_file[label] = {
            device: run(
                checkout,
                file,
                device,
                extra,
                args.timeout,
                kept_report(args.reports, label, device, extra),
                args.workers,
            )
            for device in devices
        }
        print("\n".join(table({label: per_file[label]}, devices)[2:]), flush=True)  # each file as it finishes
        if args.markdown:  # rewritten after each file: a long run's table is never lost
            write(args.markdown, table(per_file, devices) + [""] + summary(per_file, devices))
    print("\n".join(table(per_file, devices)))
    print("\n".join(summary(per_file, devices)))
    return 0


def write(path: Path, lines: list[str]) -> None:
    temporary = path.with_suffix(".partial")
    temporary.write_text("\n".join(lines) + "\n")
    temporary.replace(path)


if __name__ == "__main__":
    sys.exit(main())
