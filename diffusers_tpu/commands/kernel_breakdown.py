"""Where a step's device time goes: kernel tables from ``jax.profiler`` and ``torch.profiler``, sorted into the
same categories for both (attention, matmuls, norms and reductions, elementwise, copies and transposes, casts).

Kernel names are the only thing both profilers share: XLA names a fusion after its root (``loop_convert_fusion``,
``input_transpose_fusion``), cuBLAS/cuDNN/flash kernels carry their library's name, torch's elementwise kernels
carry their functor (``bfloat16_copy_kernel_cuda``). The categories are a reading aid; the raw per-kernel table is
kept beside them so a surprising split can be checked by name.
"""

from __future__ import annotations

import collections
import glob
import gzip
import json
import os

from torch.autograd import DeviceType

CATEGORIES = ("attention", "matmul", "copy/transpose", "cast", "norm/reduce", "elementwise", "other")

# (category, substrings of the lower-cased kernel or op name), first match wins: attention before matmul (flash
# kernels contain "gemm"-like words), copies before casts (a bf16 copy kernel is a cast in torch).
_RULES = (
    ("attention", ("flash", "fmha", "sdpa", "attention", "cudnn_generated", "softmax")),
    (
        "matmul",
        (
            "gemm",
            "nvjet",
            "cublas",
            "cutlass",
            "xmma",
            "wgmma",
            "matmul",
            "aten::mm",
            "aten::addmm",
            "aten::linear",
            "aten::bmm",
            "dot",
            "convolution",
            "conv2d",
            "conv3d",
        ),
    ),
    ("cast", ("convert", "_to_copy", "aten::to", "float_copy", "bfloat16_copy", "half_copy")),
    (
        "copy/transpose",
        (
            "transpose",
            "copy",
            "memcpy",
            "memset",
            "concatenate",
            "slice",
            "scatter",
            "gather",
            "pad",
            "cat_",
            "aten::cat",
            "contiguous",
            "clone",
            "permute",
            "index",
            "dynamic_update",
        ),
    ),
    ("norm/reduce", ("reduce", "norm", "mean", "rsqrt", "welford", "aten::sum", "var")),
    (
        "elementwise",
        (
            "elementwise",
            "loop_",
            "fusion",
            "multiply",
            "add",
            "mul",
            "gelu",
            "silu",
            "tanh",
            "exp",
            "sin",
            "cos",
            "pow",
            "where",
            "select",
            "broadcast",
            "aten::",
        ),
    ),
)


def category(name: str) -> str:
    lowered = name.lower()
    for label, needles in _RULES:
        if any(needle in lowered for needle in needles):
            return label
    return "other"


def summarize(kernels: dict[str, tuple[float, int]], per: int = 1, top: int = 80) -> dict:
    """``kernels``: {name: (total seconds, calls)} over ``per`` repetitions → per-repetition categories and the
    ``top`` kernels by time."""
    totals = collections.Counter()
    for name, (seconds, _) in kernels.items():
        totals[category(name)] += seconds / per
    device_seconds = sum(totals.values())
    ranked = sorted(kernels.items(), key=lambda item: -item[1][0])[:top]
    return {
        "device_seconds": device_seconds,
        "categories": {
            label: {"seconds": totals[label], "share": totals[label] / device_seconds if device_seconds else 0.0}
            for label in CATEGORIES
        },
        "top_kernels": [
            {"name": name[:160], "category": category(name), "seconds": seconds / per, "calls": calls // per}
            for name, (seconds, calls) in ranked
        ],
    }


def jax_kernels(trace_dir: str) -> dict[str, tuple[float, int]]:
    """{kernel: (seconds, calls)} from the newest perfetto trace that ``jax.profiler.trace(trace_dir,
    create_perfetto_trace=True)`` wrote: device-side events where the platform has them (GPU streams), else the
    host's XLA-op events (the CPU runs ops on host threads)."""
    paths = sorted(
        glob.glob(os.path.join(trace_dir, "**", "perfetto_trace.json.gz"), recursive=True), key=os.path.getmtime
    )
    if not paths:
        raise FileNotFoundError(f"no perfetto_trace.json.gz under {trace_dir}")
    with gzip.open(paths[-1]) as handle:
        data = json.load(handle)
    events = data["traceEvents"] if isinstance(data, dict) else data
    processes = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}
    threads = {
        (e["pid"], e.get("tid")): e["args"]["name"]
        for e in events
        if e.get("ph") == "M" and e.get("name") == "thread_name"
    }
    timed = [e for e in events if e.get("ph") == "X" and "dur" in e]
    device = [e for e in timed if processes.get(e["pid"], "").startswith("/device:")]
    chosen = _kernel_lines(device, threads) or [
        e for e in timed if "hlo_op" in e.get("args", {}) and not e["name"].startswith("end:")
    ]
    table: dict[str, list] = collections.defaultdict(lambda: [0.0, 0])
    for event in chosen:
        name = event["name"]
        op = event.get("args", {}).get("hlo_op")
        key = f"{name} [{op}]" if op and op != name else name
        table[key][0] += event["dur"] * 1e-6
        table[key][1] += 1
    return {name: (seconds, calls) for name, (seconds, calls) in table.items()}


def _kernel_lines(device: list, threads: dict) -> list:
    """A device's kernels, each once: a GPU plane also carries lines derived from them (``XLA Modules`` spans a
    whole program, ``XLA Ops`` repeats the kernels under their HLO names); keep the stream lines when there are
    any, else the op line, never the module line."""
    line = lambda e: threads.get((e["pid"], e.get("tid")), "")  # noqa: E731
    streams = [e for e in device if line(e).lower().startswith("stream")]
    if streams:
        return streams
    return [e for e in device if "module" not in line(e).lower() and "step" not in line(e).lower()]


def torch_kernels(profile) -> dict[str, tuple[float, int]]:
    """{kernel: (seconds, calls)} from a finished ``torch.profiler.profile``: CUDA kernels when it recorded any,
    else the CPU ops' self time (a CPU run)."""
    table: dict[str, list] = collections.defaultdict(lambda: [0.0, 0])
    for event in profile.events():
        if event.device_type == DeviceType.CUDA:  # kernels, memcpy, memset: each once, with its own duration
            table[event.name][0] += event.time_range.elapsed_us() * 1e-6
            table[event.name][1] += 1
    if not table:
        for entry in profile.key_averages():
            if entry.self_cpu_time_total > 0:
                table[entry.key][0] += entry.self_cpu_time_total * 1e-6
                table[entry.key][1] += entry.count
    return {name: (seconds, calls) for name, (seconds, calls) in table.items()}


def format_breakdown(label: str, summary: dict, step_seconds: float | None = None) -> str:
    lines = [
        f"{label}: device time {summary['device_seconds'] * 1e3:.1f} ms per step"
        + (f" (step wall {step_seconds * 1e3:.1f} ms)" if step_seconds else "")
    ]
    for name in CATEGORIES:
        entry = summary["categories"][name]
        if entry["seconds"]:
            lines.append(f"  {name:<16}{entry['seconds'] * 1e3:>10.1f} ms {entry['share']:>7.1%}")
    return "\n".join(lines)
