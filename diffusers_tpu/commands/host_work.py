"""``bench``'s loop figures: per denoising step, the host's own time, the time inside compiled programs and the
compiled calls, from one more call in which every compiled call waits for its results (so the two times separate);
for a streaming pipeline the same per block (its latency's host part). And which scheduler methods run as programs.

On a TPU JAX runs ahead of the host, so the host's part hides behind a long step and shows in a short one (few-step
image models, a streaming block): it is what the compiled scheduler step and a loop without syncs shrink.
"""

from __future__ import annotations

import bisect
import time

import jax
import torch

from ..runtime.attach import pipeline_runtime
from .pipeline_call import call_arguments
from .stage_timer import summarize


def loop_figures(pipe, call: dict, seed: int = 0) -> dict:
    """One call of ``pipe(**call)`` with each compiled call timed to its results; the report's ``loop`` section."""
    calls: list[tuple[float, float]] = []  # (start, seconds inside) of each compiled call
    marks: list[float] = []  # the progress bar's updates: the end of each step (a block for a streaming pipeline)
    stock_call = jax.stages.Compiled.__call__

    def timed(compiled, *args, **kwargs):
        start = time.perf_counter()
        out = jax.block_until_ready(stock_call(compiled, *args, **kwargs))
        calls.append((start, time.perf_counter() - start))
        return out

    stock_bar = pipe.progress_bar

    def progress_bar(*args, **kwargs):
        bar = stock_bar(*args, **kwargs)
        update = bar.update
        marks.append(time.perf_counter())

        def marked(n=1):
            marks.append(time.perf_counter())
            return update(n)

        bar.update = marked
        return bar

    streaming = hasattr(pipe, "block_timings")
    arguments = call_arguments(pipe, call)
    before = vars(pipe).get("progress_bar")  # the runtime's own (timed) bar, if any: put back after
    jax.stages.Compiled.__call__, pipe.progress_bar = timed, progress_bar
    try:
        pipe(**arguments, generator=torch.Generator().manual_seed(seed))
    finally:
        jax.stages.Compiled.__call__ = stock_call
        if before is None:
            vars(pipe).pop("progress_bar", None)
        else:
            pipe.progress_bar = before
    starts = [start for start, _ in calls]
    walls, inside, counts = [], [], []
    for begin, end in zip(marks, marks[1:]):
        within = calls[bisect.bisect_left(starts, begin) : bisect.bisect_left(starts, end)]
        walls.append(end - begin)
        inside.append(sum(seconds for _, seconds in within))
        counts.append(len(within))
    if not walls:
        return {}
    host = [wall - programs for wall, programs in zip(walls, inside)]
    later = slice(1, None) if len(walls) > 1 else slice(None)  # the first step compiles on a first call
    report = {
        "unit": "block" if streaming else "step",
        "host_ms": 1e3 * sum(host[later]) / len(host[later]),
        "programs_ms": 1e3 * sum(inside[later]) / len(inside[later]),
        "compiled_calls": sum(counts[later]) / len(counts[later]),
        "schedulers": schedulers_report(pipe),
    }
    if streaming:
        report["block_host"] = summarize(host)
    return report


def schedulers_report(pipe) -> dict:
    """Each scheduler method of the pipeline: "compiled", or why it runs op by op (named once in the log too)."""
    runtime = pipeline_runtime.runtime_of(pipe)
    found = {}
    for scheduler, methods in getattr(runtime, "scheduler_programs", {}).values():
        for name, method in methods.items():
            reasons = [v for v in getattr(method, "programs", {}).values() if isinstance(v, str)]
            eager = getattr(method, "eager_reason", None) or (reasons[0] if reasons else None)
            if hasattr(method, "compiled_calls"):
                found[f"{type(scheduler).__name__}.{name}"] = f"op by op: {eager}" if eager else "compiled"
    return found


def format_loop(report: dict) -> list[str]:
    """The report's loop lines (``bench``'s table)."""
    loop = report["jax"].get("loop")
    if not loop:
        return []
    unit = loop["unit"]
    line = (
        f"per {unit} on the host {loop['host_ms']:.2f} ms, inside programs {loop['programs_ms']:.2f} ms, "
        f"{loop['compiled_calls']:.1f} compiled calls"
    )
    torch_steps = report.get("torch", {}).get("stages", {}).get("steps")
    if torch_steps and unit == "step":
        line += f"; stock torch's whole step {1e3 * torch_steps['median_s']:.2f} ms"
    lines = [line]
    if "block_host" in loop:
        block = loop["block_host"]
        lines.append(
            f"block latency's host part: mean {1e3 * block['mean_s']:.2f} / median {1e3 * block['median_s']:.2f} / "
            f"P95 {1e3 * block['p95_s']:.2f} ms"
        )
    lines += [f"  {name}: {state}" for name, state in loop["schedulers"].items()]
    return lines
