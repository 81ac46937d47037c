"""``runtime.call.hook_chain``: the hooks around the denoiser, ``encode_prompt`` and the VAE's methods — declared in
one order, listed by ``repr``, registered and removed by name, all run from one frame."""

import types

import pytest

from diffusers_tpu import TPUConfig
from diffusers_tpu.runtime.attach import pipeline_runtime
from diffusers_tpu.runtime.call import hook_chain
from diffusers_tpu.testing import tiny


def test_a_moved_pipeline_lists_the_hooks_of_its_denoiser_encode_prompt_and_vae():
    pipe = tiny.wan_pipeline("wan").to("jax", config=TPUConfig(batch_cfg=True))
    try:
        runtime = pipeline_runtime.runtime_of(pipe)
        chain = runtime.chain(pipe.transformer)
        assert (
            repr(chain) == "HookChain(WanTransformer3DModel.forward: user_entry > cfg_pairing > recording > Denoiser)"
        )
        assert chain.inner is runtime.denoisers["transformer"]  # what runs inside the hooks: the compiled entry
        assert pipe.transformer.forward is chain  # what a call meets first
        assert runtime.compiled_of(pipe.transformer) is chain.inner.whole
        assert runtime.chain(pipe, "encode_prompt").names == ["user_entry", "cfg_pairing", "on_host"]
        assert runtime.chain(pipe.vae, "decode").names == ["user_entry", "onto_mesh"]
        with pytest.raises(KeyError, match="no 'family' hook"):
            chain.get("family")
    finally:
        pipe.to("cpu")
    assert "forward" not in vars(pipe.transformer) and "encode_prompt" not in vars(pipe)  # every chain undone


def test_hunyuanvideo15_adds_its_family_hook_inside_the_pair():
    pipe = tiny.hunyuan15_pipeline().to("jax", config=TPUConfig(batch_cfg=True))
    try:
        chain = pipeline_runtime.runtime_of(pipe).chain(pipe.transformer)
        assert list(chain.hooks) != ["user_entry", "cfg_pairing", "family", "recording"]  # registered in another order
        assert chain.names == ["user_entry", "cfg_pairing", "family", "recording"]
    finally:
        pipe.to("cpu")


class _Add(hook_chain.Hook):
    def __init__(self, name, amount, log):
        self.name, self.amount, self.log = name, amount, log

    def pre_call(self, call):
        self.log.append(f"pre {self.name}")
        call.args = (call.args[0] + self.amount,)

    def post_call(self, call, output):
        self.log.append(f"post {self.name}")
        return output * 10


def test_hooks_run_in_the_declared_order_whatever_the_order_they_were_registered_in():
    log = []
    owner = types.SimpleNamespace(forward=lambda x: log.append("inner") or x)
    chain = hook_chain.HookChain(owner, "forward", lambda: True)
    chain.register(_Add("recording", 1, log))
    chain.register(_Add("user_entry", 100, log))
    assert chain(0) == 10100  # (0 + 100 + 1) * 10 * 10
    assert log == ["pre user_entry", "pre recording", "inner", "post recording", "post user_entry"]
    assert repr(chain) == "HookChain(SimpleNamespace.forward: user_entry > recording > <lambda>)"
    chain.remove("user_entry")
    assert chain(0) == 10 and repr(chain).endswith("recording > <lambda>)")
    with pytest.raises(ValueError, match="unknown hook 'cache'"):
        chain.register(_Add("cache", 0, log))
    with pytest.raises(ValueError, match="has a 'recording' hook already"):
        chain.register(_Add("recording", 0, log))


def test_a_hook_may_answer_the_call_and_the_inside_then_does_not_run():
    class Answer(hook_chain.Hook):
        name = "cfg_pairing"

        def pre_call(self, call):
            call.answer("answered")

    log = []
    chain = hook_chain.HookChain(types.SimpleNamespace(forward=lambda: log.append("inner")), "forward", lambda: True)
    chain.register(Answer())
    chain.register(_Add("recording", 0, log))
    chain.register(hook_chain.UserEntry(types.SimpleNamespace(inside_call=lambda: True)))
    assert chain() == "answered" and log == []


def test_a_chain_left_behind_after_the_runtime_detached_runs_what_was_there_before():
    class Box:
        def greet(self):
            return "stock"

    box, state = Box(), {"active": True}
    chain = hook_chain.HookChain(box, "greet", lambda: state["active"])
    chain.register(_Add("recording", 0, []))
    vars(box)["greet"] = chain
    state["active"] = False
    assert chain() == "stock"


def test_a_hook_s_contexts_enclose_what_is_inside_it_and_close_before_its_post_call_or_on_an_error():
    import contextlib

    log = []

    @contextlib.contextmanager
    def scope(name):
        log.append(f"enter {name}")
        try:
            yield
        finally:
            log.append(f"exit {name}")

    class Scoped(hook_chain.Hook):
        def __init__(self, name):
            self.name = name

        def pre_call(self, call):
            call.stack.enter_context(scope(self.name))

        def post_call(self, call, output):
            log.append(f"post {self.name}")
            return output

    def inner(fail=False):
        log.append("inner")
        if fail:
            raise RuntimeError("inside")
        return 1

    chain = hook_chain.HookChain(types.SimpleNamespace(forward=inner), "forward", lambda: True)
    chain.register(Scoped("user_entry"))
    chain.register(Scoped("on_host"))
    assert chain() == 1
    assert log == [
        "enter user_entry",
        "enter on_host",
        "inner",
        "exit on_host",
        "post on_host",
        "exit user_entry",
        "post user_entry",
    ]
    log.clear()
    with pytest.raises(RuntimeError, match="inside"):
        chain(fail=True)
    assert log == ["enter user_entry", "enter on_host", "inner", "exit on_host", "exit user_entry"]


def test_a_chain_shows_the_method_s_signature_and_is_shared_by_copies():
    """Stock pipelines read ``inspect.signature(self.transformer.forward)`` to decide which keywords to pass."""
    import copy
    import inspect

    pipe = tiny.wan_pipeline("wan").to("jax")
    try:
        assert "encoder_hidden_states_image" in inspect.signature(pipe.transformer.forward).parameters
        assert "negative_prompt" in inspect.signature(pipe.encode_prompt).parameters
        chain = pipe.transformer.forward
        assert copy.deepcopy(chain) is chain and copy.copy(chain) is chain
    finally:
        pipe.to("cpu")
