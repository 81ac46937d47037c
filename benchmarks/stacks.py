"""One cell of the version matrix (``noxfile.py``), run inside the cell's venv, and the table of every cell.

    python benchmarks/stacks.py cell CELL -- PIP_ARGS   # pip install PIP_ARGS, then the checks: into docs/stacks.json
    python benchmarks/stacks.py table                   # docs/stacks.md's table from docs/stacks.json

The checks, each a process of its own, timed: ``pip check``; ``--help``; the demo command (README's first); the parity
table (``tests/families/test_parity.py``: every family against stock torch on one device); the 8-device mesh
(``tests/runtime/test_mesh.py``, its slow family cases included: Wan on five meshes, CogVideoX, Wan 2.2,
HunyuanVideo-1.5 and causal Wan against stock); the TPU compiler (libtpu, no TPU) building a denoiser step and a
video VAE decoder for v5e and v6e; the private device shared with TorchTPU. Standard library only: a cell whose install
was refused still records why.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from importlib import metadata

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "docs", "stacks.json")
PAGE = os.path.join(ROOT, "docs", "stacks.md")
PACKAGES = ("torch", "jax", "jaxlib", "libtpu", "torchax", "diffusers", "transformers", "torch-tpu")
PYTEST = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q"]
TPU = [
    "tests/planner/test_tpu_families.py::test_every_family_compiles_for_tpu[wan-v6e-4]",
    "tests/planner/test_tpu_families.py::test_every_family_compiles_for_tpu[wan-v5e-1]",
    "tests/planner/test_tpu_vae.py::test_every_3d_vae_decoder_compiles_for_tpu[wan-v5e-1-highest]",
    "tests/planner/test_tpu_vae.py::test_every_3d_vae_decoder_compiles_for_tpu[wan-v6e-4-default]",
]
CHECKS = {
    "pip check": [sys.executable, "-m", "pip", "check"],
    "--help": [sys.executable, "-m", "diffusers_tpu.commands.cli", "--help"],
    "demo": [sys.executable, "-m", "diffusers_tpu.commands.cli", "generate", "--output", "{tmp}/video.mp4"],
    "parity, 1 device": [*PYTEST, "-n", "2", "tests/families/test_parity.py"],
    "parity, 8-device mesh": [
        *PYTEST,
        "-n",
        "2",
        "-m",
        "mesh_slow or not mesh_slow",
        "-k",
        "not two_processes",
        "tests/runtime/test_mesh.py",
    ],
    "TPU compiler: step + video VAE, v5e/v6e": [*PYTEST, "-n", "2", "-m", "tpu_slow", *TPU],
    # TorchTPU's device named first (its own set-up where torch-tpu is installed, else the rename that stands in)
    "beside TorchTPU": [*PYTEST, "-n", "2", "tests/interop/test_shared_device.py"],
}


def versions() -> dict:
    found = {"python": ".".join(map(str, sys.version_info[:3]))}
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def _summary(output: str) -> str:
    """pytest's last line (``12 passed, 1 skipped in 3.2s``), else the output's last line."""
    lines = [line for line in output.strip().splitlines() if line.strip()]
    for line in reversed(lines):
        if re.search(r"\d+ (passed|failed|error)", line):
            return line.strip("= ")
    return lines[-1][-300:] if lines else ""


def run_checks() -> dict:
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, command in CHECKS.items():
            start = time.perf_counter()
            done = subprocess.run(
                [part.format(tmp=tmp) for part in command], cwd=ROOT, capture_output=True, text=True, check=False
            )
            output = done.stdout + done.stderr
            results[name] = {
                "passed": done.returncode == 0,
                "minutes": round((time.perf_counter() - start) / 60, 1),
                "summary": _summary(output),
            }
            if done.returncode != 0:
                results[name]["tail"] = output[-3000:]
            print(f"{name}: {'passed' if done.returncode == 0 else 'FAILED'} ({results[name]['summary']})", flush=True)
    return results


def record(cell: str, entry: dict) -> None:
    found = json.load(open(RESULTS)) if os.path.exists(RESULTS) else {}
    found[cell] = entry
    temporary = RESULTS + ".partial"
    with open(temporary, "w") as handle:
        json.dump(found, handle, indent=1, sort_keys=True)
    os.replace(temporary, RESULTS)


def _refusal(output: str) -> str:
    """Why pip refused the install: the project's own answer (its ``python_requires``) when it has one, else pip's last
    error line (the resolver stops at the first dependency without a wheel for this interpreter)."""
    own = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--dry-run", "-q", "."],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    errors = [
        line.strip()
        for line in (own.stdout + own.stderr + "\n" + output).splitlines()
        if line.startswith("ERROR:") and "Ignored the following versions" not in line
    ]
    return errors[0] if errors else output.strip()[-300:]


def run(cell: str, pip_arguments: list[str]) -> int:
    start = time.perf_counter()
    install = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", *pip_arguments], cwd=ROOT, capture_output=True, text=True
    )
    entry = {"date": datetime.date.today().isoformat(), "versions": versions()}
    if install.returncode != 0:  # the install refused: that is the cell's result (python_requires, a missing wheel)
        entry.update(result="refused at install", reason=_refusal(install.stdout + install.stderr))
    else:
        entry["checks"] = run_checks()
        entry["result"] = "passed" if all(c["passed"] for c in entry["checks"].values()) else "failed"
    entry["minutes"] = round((time.perf_counter() - start) / 60, 1)
    record(cell, entry)
    print(f"{cell}: {entry['result']} in {entry['minutes']} min", flush=True)
    return 0 if entry["result"] != "failed" else 1


def _counts(check: dict) -> str:
    """A check's outcome in a few words: pytest's counts, else ok / FAILED."""
    found = re.findall(r"\d+ (?:passed|failed|errors?|skipped)", check["summary"])
    return ", ".join(found) if found else ("ok" if check["passed"] else "FAILED")


def table() -> str:
    found = json.load(open(RESULTS))
    head = ["cell", "python", *PACKAGES, "result", "minutes", "date"]
    rows = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for cell, entry in found.items():
        seen = entry["versions"]
        result = entry["result"]
        if "checks" in entry:
            result += ": " + "; ".join(
                f"{name} {_counts(entry['checks'][name])}" for name in CHECKS if name in entry["checks"]
            )
        elif entry.get("reason"):
            result += f": {entry['reason']}"
        values = [seen.get("python")] + [seen.get(name) or "—" for name in PACKAGES]
        rows.append(
            "| " + " | ".join([f"`{cell}`", *map(str, values), result, str(entry["minutes"]), entry["date"]]) + " |"
        )
    return "\n".join(rows)


def write_table() -> None:
    page = open(PAGE).read()
    start, end = "<!-- generated by `python benchmarks/stacks.py table` -->", "<!-- end of generated table -->"
    before, rest = page.split(start)
    _, after = rest.split(end)
    temporary = PAGE + ".partial"
    with open(temporary, "w") as handle:
        handle.write(f"{before}{start}\n\n{table()}\n\n{end}{after}")
    os.replace(temporary, PAGE)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/stacks.py")
    commands = parser.add_subparsers(dest="command", required=True)
    running = commands.add_parser("cell")
    running.add_argument("cell")
    running.add_argument("pip_arguments", nargs="+", help="after --: what pip installs (the project and the pins)")
    commands.add_parser("table")
    args = parser.parse_args(argv)
    if args.command == "cell":
        return run(args.cell, args.pip_arguments)
    write_table()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
