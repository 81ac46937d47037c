"""How many of the project's frames stand between stock code and each compiled program a call runs.

At every program JAX runs — a ``jax.stages.Compiled`` call (the programs the project builds), a jitted function
(``PjitFunction``) or a primitive applied eagerly (``dispatch.apply_primitive``: an eager op's program) — the stack
is walked from the innermost frame of stock code (diffusers, transformers, the caller's own script, or a method of
the pipeline class itself, which for the project's own pipelines plays stock's role) to the program;
the project's frames among those are counted. ``sys.setprofile`` sees C calls too, so none of them is missed."""

from __future__ import annotations

import collections
import contextlib
import os
import sys

import jax
from diffusers import DiffusionPipeline

import diffusers_tpu

MOST = 5  # the most of the project's frames allowed between stock code and a program it runs
_ROOT = os.path.dirname(diffusers_tpu.__file__) + os.sep
_STOCK = tuple(f"{os.sep}{name}{os.sep}" for name in ("diffusers", "transformers"))


def _pipeline_code(frame) -> bool:
    """A method of the pipeline class itself (``self`` a ``DiffusionPipeline`` and the function defined in its class
    hierarchy): the project's own pipelines (``CausalWanPipeline``) play the role stock's ``__call__`` plays."""
    owner = frame.f_locals.get("self")
    if not isinstance(owner, DiffusionPipeline):
        return False
    defined_in = frame.f_code.co_qualname.split(".")[0]
    return any(cls.__name__ == defined_in for cls in type(owner).__mro__)


def _ours_since_stock(frame, caller: str) -> tuple[str, ...]:
    frames = []
    while frame is not None:
        frames.append(frame)
        frame = frame.f_back
    frames.reverse()
    files = [f.f_code.co_filename for f in frames]
    stock = [
        i
        for i, name in enumerate(files)
        if name == caller or any(s in name for s in _STOCK) and _ROOT not in name or _pipeline_code(frames[i])
    ]
    start = stock[-1] + 1 if stock else 0
    return tuple(
        f"{os.path.relpath(f.f_code.co_filename, _ROOT)}:{f.f_code.co_qualname}"
        for f in frames[start:]
        if f.f_code.co_filename.startswith(_ROOT)
    )


class Depths:
    """Per depth, how many program calls were that deep, and the first chain of frames seen at each depth."""

    def __init__(self):
        self.counts: collections.Counter = collections.Counter()
        self.examples: dict[int, tuple[str, ...]] = {}

    def add(self, chain: tuple[str, ...]) -> None:
        self.counts[len(chain)] += 1
        self.examples.setdefault(len(chain), chain)

    @property
    def deepest(self) -> int:
        return max(self.counts, default=0)

    def __repr__(self) -> str:
        worst = self.deepest
        return f"Depths({dict(sorted(self.counts.items()))}; deepest: {' > '.join(self.examples.get(worst, ()))})"


@contextlib.contextmanager
def measured(caller: str):
    """Count the project's frames at every program run inside the block; ``caller``: the file of the code that
    calls the pipeline (its frames are stock code too)."""
    depths = Depths()

    from jax._src import dispatch, stages  # noqa: PLC0415 - the code objects of the calls that run programs

    programs = {stages.Compiled.__call__.__code__, dispatch.apply_primitive.__code__}
    jitted = type(jax.jit(abs))

    def profile(frame, event, arg):
        if event == "call":
            if frame.f_code in programs:
                depths.add(_ours_since_stock(frame.f_back, caller))
        elif event == "c_call" and type(arg) is jitted:
            depths.add(_ours_since_stock(frame, caller))

    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        yield depths
    finally:
        sys.setprofile(previous)
