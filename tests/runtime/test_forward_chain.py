"""The layers around a placed denoiser's ``forward``: declared in one order, listed, found by name."""

import pytest

from diffusers_tpu import TPUConfig
from diffusers_tpu.runtime.attach import overrides, pipeline_runtime
from diffusers_tpu.runtime.call import forward_chain
from diffusers_tpu.testing import tiny


def test_a_placed_denoiser_lists_its_layers_in_the_declared_order():
    pipe = tiny.wan_pipeline("wan").to("jax", config=TPUConfig(batch_cfg=True))
    try:
        runtime = pipeline_runtime.runtime_of(pipe)
        chain = runtime.chain_of(pipe.transformer)
        assert list(chain.installed) == ["program", "recording", "cfg_pairing", "user_entry"]
        assert repr(chain) == "ForwardChain(WanTransformer3DModel: user_entry > cfg_pairing > recording > program)"
        assert chain.get("program") is runtime.denoisers["transformer"]
        assert pipe.transformer.forward is chain.get("user_entry")  # what a call meets first
        assert runtime.compiled_of(pipe.transformer) is chain.get("program").whole  # programs, by name
        with pytest.raises(KeyError, match="no 'family' layer"):
            chain.get("family")
    finally:
        pipe.to("cpu")
    assert "forward" not in vars(pipe.transformer)  # every layer undone with the move back


def test_hunyuanvideo15_adds_its_family_layer_inside_the_pair():
    pipe = tiny.hunyuan15_pipeline().to("jax", config=TPUConfig(batch_cfg=True))
    try:
        chain = pipeline_runtime.runtime_of(pipe).chain_of(pipe.transformer)
        assert list(chain.installed)[:3] == ["program", "recording", "family"]
    finally:
        pipe.to("cpu")


def test_a_layer_out_of_order_or_unknown_is_refused():
    class Module:
        def forward(self, x):
            return x

    module = Module()
    chain = forward_chain.ForwardChain(module, overrides.Overrides(lambda: True))
    chain.add("recording", lambda inner: lambda x: inner(x) + 1)
    assert module.forward(1) == 2
    with pytest.raises(RuntimeError, match="out of the declared order"):
        chain.add("program", lambda inner: inner)
    with pytest.raises(ValueError, match="unknown denoiser layer 'cache'"):
        chain.add("cache", lambda inner: inner)
