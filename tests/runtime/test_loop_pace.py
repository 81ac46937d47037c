"""The denoising loop at the device's pace: each step is a few compiled calls (the denoiser, the scheduler's step),
and nothing in the loop waits for the devices, so step i+1's denoiser is dispatched before step i's result is read
(JAX runs ahead of the host). The progress bar's step times are read on a thread of its own."""

import threading

import jax
import pytest
import torch
from jax._src import array as jax_array

import diffusers_tpu
from diffusers_tpu.testing import tiny

CALL = dict(
    prompt=["a cat walks on the grass", "a red fox jumps over a sleeping dog"],
    negative_prompt=["blurry", "low quality"],
    height=32,
    width=32,
    num_frames=9,
    num_inference_steps=6,
    output_type="latent",
)


class _Spy:
    """Compiled calls and host reads of their results, on the calling thread, in order."""

    def __init__(self, monkeypatch):
        self.events, self.produced, self.thread = [], set(), threading.get_ident()
        stock_call = jax.stages.Compiled.__call__
        spy = self

        def call(compiled, *args, **kwargs):
            out = stock_call(compiled, *args, **kwargs)
            if threading.get_ident() == spy.thread:
                spy.events.append(("call", None))
                spy.produced.update(id(a) for a in jax.tree_util.tree_leaves(out) if isinstance(a, jax.Array))
            return out

        def read(name, stock):
            def reader(array, *args, **kwargs):
                if threading.get_ident() == spy.thread and id(array) in spy.produced:
                    spy.events.append(("read", name))
                return stock(array, *args, **kwargs)

            return reader

        monkeypatch.setattr(jax.stages.Compiled, "__call__", call)
        for name in ("__array__", "block_until_ready", "item", "tolist"):
            monkeypatch.setattr(jax_array.ArrayImpl, name, read(name, getattr(jax_array.ArrayImpl, name)))
        value = jax_array.ArrayImpl._value
        monkeypatch.setattr(jax_array.ArrayImpl, "_value", property(read("_value", value.fget)))
        stock_wait = jax.block_until_ready

        def wait(tree):
            if threading.get_ident() == spy.thread and any(
                id(a) in spy.produced for a in jax.tree_util.tree_leaves(tree)
            ):
                spy.events.append(("read", "jax.block_until_ready"))
            return stock_wait(tree)

        monkeypatch.setattr(jax, "block_until_ready", wait)


@pytest.mark.parametrize("scheduler", ["unipc", "flow_match"])
def test_no_step_waits_for_the_devices(scheduler, monkeypatch):
    pipe = tiny.wan_pipeline(scheduler=scheduler)
    pipe.to("jax")
    pipe(**CALL, generator=torch.Generator().manual_seed(0))  # first call: compiles
    spy = _Spy(monkeypatch)
    latents = pipe(**CALL, generator=torch.Generator().manual_seed(0)).frames
    calls = [i for i, (kind, _) in enumerate(spy.events) if kind == "call"]
    reads = [(i, name) for i, (kind, name) in enumerate(spy.events) if kind == "read"]
    assert len(calls) >= 2 * CALL["num_inference_steps"]  # the denoiser and the scheduler's step, every step
    assert [read for read in reads if read[0] < calls[-1]] == []  # nothing read before the loop's last call
    assert torch.isfinite(latents).all() and diffusers_tpu.stats(pipe).compilations == 0
    assert len(diffusers_tpu.stats(pipe).step_seconds) == CALL["num_inference_steps"]  # timed all the same
