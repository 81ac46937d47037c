"""What older diffusers releases (0.38-0.41, inside the declared range) do otherwise than 0.42, made to behave as 0.42
does for a pipeline on JAX: each entry with its reason, the versions it was checked on and its guard, set through
``patching.wrap`` when ``diffusers.pipelines.pipeline_utils`` is imported. Pipelines not moved to JAX are untouched.
"""

from __future__ import annotations

from ...interop import patching
from ..attach import pipeline_runtime


# --- ``pipe.device`` names the accelerator --------------------------------------------------------------------
# Reason: diffusers 0.38-0.40's ``DiffusionPipeline.device`` returns the first component's device; on JAX the text
# encoders stay on the host (``TPUConfig(text_encoder="host")``), so it said "cpu", ``_execution_device`` too, and the
# stock loop made its timesteps and latents there: the guidance pair could not be batched and ``pipe.device`` was not
# what ``pipe.to`` was asked for. diffusers 0.41+ return the first component that is not on the CPU (or ``meta``),
# which is what this does for a pipeline on JAX. Checked on 0.38.0, 0.42.1. Guard: a pipeline on JAX only; a no-op
# where the stock property already answers the accelerator.
def _device(stock):
    stock_get = stock.fget

    def device(self):
        found = stock_get(self)
        if found.type not in ("cpu", "meta") or not pipeline_runtime.is_attached(self):
            return found
        for module in self.components.values():
            placed = getattr(module, "device", None)
            if placed is not None and getattr(placed, "type", "cpu") not in ("cpu", "meta"):
                return placed
        return found

    return patching.Property(device, doc=stock.__doc__)


def apply(pipeline_utils) -> None:
    patching.wrap(pipeline_utils.DiffusionPipeline, "device", _device, "DiffusionPipeline.device on JAX")
