"""A Ctrl-C that CPython drops (raised inside a garbage-collector callback, as JAX's own gc callback makes a real
Ctrl-C during a compile) is raised again at the next safe point (``interop.interrupts``)."""

import gc
import sys
import threading

import numpy as np
import pytest
import torch

from diffusers_tpu.interop import interrupts


class _DropOnce:
    """A gc callback that raises KeyboardInterrupt once, when armed: CPython reports it and carries on."""

    def __init__(self):
        self.armed = self.fired = False

    def __call__(self, phase, info):
        if self.armed and not self.fired:
            self.fired = True
            raise KeyboardInterrupt

    def __enter__(self):
        gc.callbacks.insert(0, self)
        return self

    def __exit__(self, *exc):
        gc.callbacks.remove(self)


def test_a_dropped_interrupt_is_raised_at_the_next_check():
    before = sys.unraisablehook
    with _DropOnce() as drop, interrupts.watch():
        assert sys.unraisablehook is not before
        drop.armed = True
        gc.collect()  # CPython drops the KeyboardInterrupt: nothing propagates here
        assert drop.fired
        with pytest.raises(KeyboardInterrupt):
            interrupts.raise_if_dropped()
        interrupts.raise_if_dropped()  # raised once
    assert sys.unraisablehook is before


def test_the_outermost_watch_raises_one_left_unchecked_and_nested_watches_keep_it():
    with _DropOnce() as drop, pytest.raises(KeyboardInterrupt):
        with interrupts.watch():
            with interrupts.watch():
                drop.armed = True
                gc.collect()
            raise AssertionError("the inner watch's end is the outer one's safe point too")  # pragma: no cover
    interrupts.raise_if_dropped()  # nothing left behind


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # the drop this test makes
def test_without_a_watch_and_off_the_main_thread_nothing_is_raised():
    with _DropOnce() as drop:
        drop.armed = True
        gc.collect()  # reported by whatever hook is there (CPython's, pytest's), as before
    assert drop.fired
    interrupts.raise_if_dropped()
    raised = []
    with _DropOnce() as drop, interrupts.watch():
        drop.armed = True
        gc.collect()

        def worker():
            try:
                interrupts.raise_if_dropped()
            except KeyboardInterrupt:  # pragma: no cover - the failure this test is for
                raised.append(True)

        thread = threading.Thread(target=worker)
        thread.start()
        thread.join()
        with pytest.raises(KeyboardInterrupt):  # still there for the main thread
            interrupts.raise_if_dropped()
    assert not raised


def test_a_pipeline_call_stops_within_a_step_and_the_pipeline_stays_usable():
    from diffusers_tpu.testing import tiny

    pipe = tiny.wan_pipeline("wan").to("jax")
    call = dict(prompt="a cat", height=32, width=32, num_frames=9, num_inference_steps=6, output_type="np")
    seen = []
    stock = pipe.scheduler.step

    with _DropOnce() as drop:

        def step(*args, **kwargs):
            seen.append(len(seen))
            if len(seen) == 2:
                drop.armed = True
                gc.collect()  # dropped inside the step: the next safe point (the step's end) raises it
            return stock(*args, **kwargs)

        pipe.scheduler.step = step
        with pytest.raises(KeyboardInterrupt):
            pipe(**call, generator=torch.Generator().manual_seed(0))
        del pipe.scheduler.step
    assert drop.fired and len(seen) == 2  # no step after the one it landed in
    first = pipe(**call, generator=torch.Generator().manual_seed(0)).frames
    again = pipe(**call, generator=torch.Generator().manual_seed(0)).frames
    assert np.isfinite(first).all() and np.array_equal(first, again)
    pipe.to("cpu")
