"""What a pipeline call on JAX reports: ``CallStats`` (``diffusers_tpu.stats(pipe)``) and the progress bar that
times each denoising step on the devices, compilation apart."""

from __future__ import annotations

import dataclasses
import time

import jax
import torch

from ...interop import backend, interrupts
from ...interop.torch_private import pytree


@dataclasses.dataclass
class CallStats:
    """Timings of the last pipeline call. Step times wait for the device (block_until_ready)."""

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


def timed_progress_bar(runtime, stock_progress_bar):
    """The pipeline's ``progress_bar`` with per-step device time (each step waits for the denoiser's last output) and
    compilation reported apart: rate and ETA count device time only."""

    def progress_bar(iterable=None, total=None, *args, **kwargs):  # a class's own options pass through (Marigold:
        bar = stock_progress_bar(iterable, total, *args, **kwargs)  # ``desc``, ``leave``)
        if iterable is not None:
            return bar
        stock_update = bar.update
        marks = {"last": time.perf_counter(), "compile": 0.0}

        def update(n=1):
            interrupts.raise_if_dropped()  # each step is a safe point for a Ctrl-C Python dropped
            if runtime.recorded is not None:
                # tensors only: an output may hold other objects (FLUX.2 klein's KV cache)
                jax.block_until_ready(pytree.tree_map_only(torch.Tensor, backend.to_jax_array, runtime.recorded))
            now = time.perf_counter()
            seconds, marks["last"] = now - marks["last"], now
            compile_now = runtime.compile_log.seconds if runtime.compile_log is not None else 0.0
            compiled, marks["compile"] = compile_now - marks["compile"], compile_now
            runtime.last_call.step_seconds.append(seconds)
            if hasattr(bar, "start_t"):  # a disabled bar has no clock
                bar.start_t += compiled  # rate and ETA count device time, not compilation
            warm = runtime.last_call.step_seconds[1:] or runtime.last_call.step_seconds
            bar.set_postfix(
                step=f"{seconds:.3f}s",
                avg=f"{sum(warm) / len(warm):.3f}s",
                compile=f"{compile_now:.1f}s",
                refresh=False,
            )
            return stock_update(n)

        bar.update = update
        return bar

    return progress_bar
