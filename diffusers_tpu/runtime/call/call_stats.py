"""What a pipeline call on JAX reports: ``CallStats`` (``diffusers_tpu.stats(pipe)``) and the progress bar that
times each denoising step on the devices, compilation apart, without making the loop wait for them."""

from __future__ import annotations

import dataclasses
import queue
import threading
import time

import jax
import torch

from ...interop import backend, interrupts
from ...interop.torch_private import pytree


@dataclasses.dataclass
class CallStats:
    """Timings of the last pipeline call. Step times: between two steps' outputs becoming ready on the devices."""

    total_seconds: float = 0.0
    compile_seconds: float = 0.0
    compilations: int = 0
    cache_hits: int = 0
    step_seconds: list[float] = dataclasses.field(default_factory=list)
    placing_programs: int = 0  # built by the ``pipe.to`` that placed the pipeline (0: its weights moved as transfers)
    process_programs: int = 0  # JAX's own count of every program this process built, up to the call's end

    @property
    def run_seconds(self) -> float:
        return max(self.total_seconds - self.compile_seconds, 0.0)

    def summary(self) -> str:
        steps = self.step_seconds
        per_step = f", {sum(steps[1:]) / (len(steps) - 1):.3f} s/step warm" if len(steps) > 1 else ""
        placing = f", {self.placing_programs} at pipe.to" if self.placing_programs else ""
        return (
            f"compile {self.compile_seconds:.2f} s ({self.compilations} programs, {self.cache_hits} from the "
            f"persistent cache; {self.process_programs} in this process so far, as JAX counts them{placing}), "
            f"run {self.run_seconds:.2f} s{per_step}, total {self.total_seconds:.2f} s"
        )


class _StepClock:
    """When each step's output became ready on the devices, read by a thread of its own: the loop never waits for a
    step (JAX runs ahead of the host), yet each step's device time is known: the time between two steps' outputs
    becoming ready. ``seconds`` grows as steps finish; ``close`` waits for the last."""

    def __init__(self, start: float):
        self.last, self.seconds = start, []
        self._steps: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._watch, name="diffusers_tpu step clock", daemon=True)
        self._thread.start()

    def step_dispatched(self, arrays) -> None:
        self._steps.put(arrays)

    def _watch(self) -> None:
        while (arrays := self._steps.get()) is not None:
            try:
                jax.block_until_ready(arrays)
            except Exception:  # a failed or deleted array: the call raises it itself
                pass
            now = time.perf_counter()
            self.seconds.append(now - self.last)
            self.last = now

    def close(self) -> list[float]:
        """Every step's time, once (a bar may be closed again when it is collected)."""
        if not self._thread.is_alive():
            return []
        self._steps.put(None)
        self._thread.join()
        return self.seconds


def timed_progress_bar(runtime, stock_progress_bar):
    """The pipeline's ``progress_bar`` with per-step device time (``_StepClock``: nothing waits for the devices in the
    loop) and compilation reported apart: rate and ETA count device time only."""

    def progress_bar(iterable=None, total=None, *args, **kwargs):  # a class's own options pass through (Marigold:
        bar = stock_progress_bar(iterable, total, *args, **kwargs)  # ``desc``, ``leave``)
        if iterable is not None:
            return bar
        stock_update, stock_close = bar.update, bar.close
        clock = _StepClock(time.perf_counter())
        marks = {"compile": 0.0}

        def update(n=1):
            interrupts.raise_if_dropped()  # each step is a safe point for a Ctrl-C Python dropped
            if runtime.recorded is not None:
                # tensors only: an output may hold other objects (FLUX.2 klein's KV cache)
                clock.step_dispatched(pytree.tree_map_only(torch.Tensor, backend.to_jax_array, runtime.recorded))
            compile_now = runtime.compile_log.seconds if runtime.compile_log is not None else 0.0
            compiled, marks["compile"] = compile_now - marks["compile"], compile_now
            if hasattr(bar, "start_t"):  # a disabled bar has no clock
                bar.start_t += compiled  # rate and ETA count device time, not compilation
            show_times(refresh=False)
            return stock_update(n)

        def show_times(refresh: bool) -> None:
            seconds = list(clock.seconds)  # the clock's thread appends as steps finish
            warm = seconds[1:] or seconds
            if warm:
                bar.set_postfix(
                    step=f"{seconds[-1]:.3f}s",
                    avg=f"{sum(warm) / len(warm):.3f}s",
                    compile=f"{marks['compile']:.1f}s",
                    refresh=refresh,
                )

        def close():  # every step's time is known once the last is ready: the bar's last line shows them
            runtime.last_call.step_seconds.extend(clock.close())
            show_times(refresh=True)
            return stock_close()

        bar.update, bar.close = update, close
        return bar

    return progress_bar
