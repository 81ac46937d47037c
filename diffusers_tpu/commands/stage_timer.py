"""``bench``'s stage timer: per-stage wall times through the stock pipeline's own seams, each stage waiting for the
device before its clock stops, and ``measure`` (warm-up calls apart, then timed calls, their compilations counted as
recompilations)."""

from __future__ import annotations

import collections
import contextlib
import time

import jax
import numpy as np
import torch

from ..interop import backend
from ..interop.compile_accounting import compile_log
from ..runtime import diffusers_private
from ..runtime.attach import pipeline_runtime
from ..runtime.attach.overrides import Overrides
from ..runtime.call.denoiser_hooks import active_hooks
from ..runtime.registry import family_of
from .measures import peak_memory as _peak_memory
from .pipeline_call import call_arguments


def summarize(values: list[float]) -> dict:
    if not values:
        return {"count": 0}
    array = np.asarray(values, dtype=np.float64)
    return {
        "count": len(values),
        "mean_s": float(array.mean()),
        "median_s": float(np.median(array)),
        "p95_s": float(np.percentile(array, 95)),
        "min_s": float(array.min()),
        "max_s": float(array.max()),
    }


def nbytes(frames) -> int:
    if isinstance(frames, np.ndarray):
        return frames.nbytes
    if isinstance(frames, torch.Tensor):
        return frames.numel() * frames.element_size()
    if isinstance(frames, (list, tuple)):
        return sum(nbytes(f) for f in frames)
    return np.asarray(frames).nbytes  # a PIL image


class StageTimer:
    """Times one pipeline's stages through its stock seams (instance overrides, removed by ``remove``)."""

    def __init__(self, pipe):
        self.pipe, self.runs, self._overrides = pipe, [], Overrides(lambda: True)
        self.cuda = not pipeline_runtime.is_attached(pipe) and pipe._execution_device.type == "cuda"
        self._last, self._run = None, None
        self._wrap(pipe, "encode_prompt", self._timed("text_encoding"))
        self._wrap(pipe.vae, "decode", self._timed("vae_decode"))
        processor = getattr(pipe, "video_processor", None)  # image pipelines: their image processor's postprocess
        if processor is not None:
            self._wrap(processor, "postprocess_video", self._timed("postprocess", count_bytes=True))
        else:
            self._wrap(pipe.image_processor, "postprocess", self._timed("postprocess", count_bytes=True))
        self._wrap(pipe, "progress_bar", self._stepping)
        # how many hooked blocks each denoiser pass computed (step caches skip some): on torch counted per call; on
        # JAX the runtime's count per cache-context pass (a batched guidance pair is two passes in one call)
        self._counters, self._entries = [], []
        attached = pipeline_runtime.runtime_of(pipe)
        for name in family_of(pipe).denoisers:
            module = getattr(pipe, name, None)
            if module is None:
                continue
            if attached is not None:
                self._entries.append(attached.denoisers[name])
            else:
                self._counters.append(self._count_hooked_blocks(module))
            self._wrap(module, "forward", self._recording)

    def _count_hooked_blocks(self, module):
        """On torch: count executions of the forward inside each hook chain below the denoiser."""
        count = [0]
        for sub in active_hooks(module):
            if sub is module:
                continue
            reference, attribute = diffusers_private.innermost_forward_reference(sub)
            inner = getattr(reference, attribute)

            def counted(*args, _inner=inner, **kwargs):
                count[0] += 1
                return _inner(*args, **kwargs)

            setattr(reference, attribute, counted)
            self._overrides.add_undo(
                lambda r=reference, a=attribute, f=inner: setattr(r, a, f), f"{type(reference).__name__}.{attribute}"
            )
        return lambda: count[0]

    def _wrap(self, owner, name, make):
        self._overrides.set(owner, name, make(getattr(owner, name)))

    def remove(self):
        self._overrides.undo_all()

    def sync(self, value=None):
        if self.cuda:
            torch.cuda.synchronize()
        elif value is not None:
            backend.synchronize(value)

    def _timed(self, stage, count_bytes=False):
        def make(method):
            def timed(*args, **kwargs):
                start = time.perf_counter()
                out = method(*args, **kwargs)
                self.sync(out)
                self._run[stage].append(time.perf_counter() - start)
                self._note_peak(stage)
                if count_bytes:
                    self._run["bytes_to_host"].append(nbytes(out))
                return out

            return timed

        return make

    def _note_peak(self, stage):
        """The device's peak so far, after ``stage``: a peak only grows, so the first stage that reaches a call's
        final figure is where it happened (and a first call's peak above a later one's is compilation's)."""
        peak = _peak_memory(self.pipe, self.cuda)
        if peak is not None:
            self._run["peak_after"].append((stage, peak))

    def _recording(self, forward):
        def recorded(*args, **kwargs):
            before = sum(counter() for counter in self._counters)
            self._last = forward(*args, **kwargs)
            if self._counters:
                self._run["hooked_blocks"].append(sum(counter() for counter in self._counters) - before)
            return self._last

        return recorded

    def _stepping(self, progress_bar):
        def stepping(iterable=None, total=None):
            bar = progress_bar(iterable=iterable, total=total)
            update, mark = bar.update, [time.perf_counter()]

            def timed_update(n=1):
                self.sync(self._last)
                now = time.perf_counter()
                self._run["steps"].append(now - mark[0])
                self._note_peak("steps")
                mark[0] = now
                return update(n)

            bar.update = timed_update
            return bar

        return stepping

    @contextlib.contextmanager
    def run(self):
        self._run = collections.defaultdict(list)
        start, passes = time.perf_counter(), [(len(e.passes), e.passes.programs) for e in self._entries]
        yield
        self._run["end_to_end"].append(time.perf_counter() - start)
        for entry, (first, programs) in zip(self._entries, passes):
            self._run["hooked_blocks"].extend(entry.passes.counts(first))
            self._run["hooked_programs"].append(entry.passes.programs - programs)
        self.runs.append(dict(self._run))


def cache_report(runs: list[dict]) -> dict:
    """Denoiser passes that a step cache shortened: passes whose hooked blocks did not all compute."""
    passes = [n for run in runs for n in run.get("hooked_blocks", [])]
    if not passes or max(passes) == 0:
        return {}
    full = max(passes)
    steps = sum(len(run.get("steps", [])) for run in runs)
    programs = sum(n for run in runs for n in run.get("hooked_programs", []))
    return {
        "denoiser_passes": len(passes),
        "cached_passes": sum(n < full for n in passes),
        "hooked_blocks_per_full_pass": full,
        # on JAX: the denoiser's compiled programs run per step (whole-step programs: 1 per call; units: per block)
        **({"denoiser_programs_per_step": programs / steps} if steps and "hooked_programs" in runs[0] else {}),
    }


def stages(runs: list[dict]) -> dict:
    pooled = collections.defaultdict(list)
    for run in runs:
        for stage, values in run.items():
            if stage in ("text_encoding", "vae_decode", "postprocess", "end_to_end"):
                pooled[stage].append(sum(values))
            elif stage == "steps":
                pooled["steps"].extend(values)
    result = {stage: summarize(values) for stage, values in pooled.items()}
    if runs and runs[0].get("bytes_to_host"):
        result["postprocess"]["bytes_to_host"] = sum(runs[0]["bytes_to_host"])
    return result


def blocks_report(timed: list[list], warmup: list[list]) -> dict:
    """Per-block figures of a causal pipeline: each transformer pass, the first block and the later (steady)
    blocks end to end (noise to frames on the host), frames per second of the steady blocks, and compilations in
    any block after the first (0 is correct: one program set serves every later block)."""
    if not timed or not timed[0]:
        return {}
    steady = [block.seconds for run in timed for block in run[1:]]
    frames = timed[0][-1].frames
    report = {
        "forward": summarize([s for run in timed for block in run for s in block.forward_seconds]),
        "forwards_per_block": len(timed[0][0].forward_seconds),
        "first_block": summarize([r[0].seconds for r in timed]),
        "block": summarize(steady),
        "frames_per_block": frames,
        "blocks_per_call": len(timed[0]),
        "compilations_after_first_block": sum(b.compilations for run in warmup + timed for b in run[1:]),
    }
    report["fps"] = frames / report["block"]["median_s"] if steady else None
    return report


def frames(output) -> np.ndarray:
    """The output's pictures as ``[videos, frames, H, W, C]`` (an image pipeline's: one frame each)."""
    videos = output.frames if hasattr(output, "frames") else [[image] for image in output.images]
    return np.stack([np.stack([np.asarray(f) for f in video]) for video in videos]).astype(np.int16)


@contextlib.contextmanager
def _trace(directory):
    with jax.profiler.trace(directory):
        yield


def measure(
    pipe, call: dict, runs: int = 3, warmup: int = 1, trace_dir: str | None = None, seed: int = 0
) -> tuple[dict, np.ndarray]:
    """Warm-up and timed calls of ``pipe(**call)`` (``output_type="pil"``); returns the report and the frames."""
    streaming = hasattr(pipe, "block_timings")  # a causal pipeline: time each transformer pass and block
    call = call_arguments(pipe, dict(call, timing=True) if streaming else call)
    timer = StageTimer(pipe)
    blocks = {"warmup": [], "timed": []}
    try:
        with compile_log() as warm_log:
            for _ in range(warmup):
                with timer.run():
                    output = pipe(**call, generator=torch.Generator().manual_seed(seed))
                blocks["warmup"].append(list(getattr(pipe, "block_timings", [])))
        warm_runs, timer.runs = timer.runs, []
        with compile_log() as timed_log:
            for index in range(runs):
                tracing = trace_dir is not None and index == 0 and pipeline_runtime.is_attached(pipe)
                with _trace(trace_dir) if tracing else contextlib.nullcontext(), timer.run():
                    output = pipe(**call, generator=torch.Generator().manual_seed(seed))
                blocks["timed"].append(list(getattr(pipe, "block_timings", [])))
    finally:
        timer.remove()
    report = {"stages": stages(timer.runs), "warmup": stages(warm_runs), "cache": cache_report(timer.runs)}
    if streaming:
        # progress updates are whole blocks, and postprocessing waits for the block's VAE decode: see "blocks"
        for stage in ("steps", "postprocess"):
            report["stages"].pop(stage, None)
        report["blocks"] = blocks_report(blocks["timed"], blocks["warmup"])
    if warm_runs and warm_runs[0].get("steps"):
        report["warmup"]["first_step_s"] = warm_runs[0]["steps"][0]
    if pipeline_runtime.is_attached(pipe):
        report["compile"] = {
            "seconds": warm_log.seconds,
            "compilations": warm_log.compilations,
            "persistent_cache_hits": warm_log.cache_hits,
            "recompilations_after_warmup": timed_log.compilations,
        }
    report["peak_memory_bytes"] = _peak_memory(pipe, timer.cuda)
    if warm_runs and warm_runs[0].get("peak_after"):
        report["peak_memory_after_stage"] = {
            "first_call": dict(warm_runs[0]["peak_after"]),
            "last_call": dict(timer.runs[-1]["peak_after"]) if timer.runs else None,
        }
    return report, frames(output)
