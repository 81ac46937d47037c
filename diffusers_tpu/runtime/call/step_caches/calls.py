"""What a call around a cached program needs: the cache contexts of a batched pair's rows, the program's extra inputs,
the log of the passes the calls ran."""

from __future__ import annotations

import contextlib
import contextvars

_ROWS: contextvars.ContextVar[tuple | None] = contextvars.ContextVar("diffusers_tpu_cache_rows", default=None)


def batched_contexts() -> tuple | None:
    """The cache contexts of the rows of the call running now, when it is a batched pair (else None)."""
    return _ROWS.get()


@contextlib.contextmanager
def batched_rows(contexts: tuple):
    """While a batched call runs: the cache contexts of its rows, in order (the guidance pair: "cond", "uncond")."""
    token = _ROWS.set(tuple(contexts))
    try:
        yield
    finally:
        _ROWS.reset(token)


class Extras:
    """A cached program's extra inputs: the LoRA scales (``lora.Scalings``) and the cache's state."""

    def __init__(self, scalings, cache):  # a ``base.StepCache``
        self.scalings, self.cache = scalings, cache

    def key(self):
        return self.scalings.key(), self.cache.key

    def values(self) -> list:
        return self.scalings.values() + list(self.cache.inputs)

    def donated(self) -> int:
        return self.cache.donated

    @contextlib.contextmanager
    def bound(self, arrays):
        split = len(arrays) - len(self.cache.inputs)
        with self.scalings.bound(arrays[:split]), self.cache.bound(arrays[split:]):
            yield


class PassLog:
    """What a denoiser's hooked calls ran, per cache-context pass (a batched guidance pair is two): how many hooked
    blocks computed — kept as the devices' decisions until read — and the programs the calls ran."""

    KEPT = 4096

    def __init__(self):
        self._passes: list = []  # (computed: bool or a device bool, blocks if computed, blocks if not)
        self._dropped = 0
        self.programs = 0

    def record(self, passes: list, programs: int) -> None:
        self._passes += passes
        self.programs += programs
        if len(self._passes) > 2 * self.KEPT:
            self._dropped += len(self._passes) - self.KEPT
            del self._passes[: -self.KEPT]

    def __len__(self) -> int:
        return self._dropped + len(self._passes)

    def counts(self, start: int = 0) -> list[int]:
        """From pass ``start`` on (the latest ``KEPT`` kept): the hooked blocks each computed (reads the devices)."""
        kept = self._passes[max(0, start - self._dropped) :]
        return [computed_n if bool(computed) else skipped_n for computed, computed_n, skipped_n in kept]
