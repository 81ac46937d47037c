"""diffusers' private names the project uses, through ``runtime.diffusers_private``, still do what it reads them for:
these fail when a diffusers release changes one."""

import types

import diffusers
import pytest
import torch
from diffusers.hooks import HookRegistry, ModelHook
from diffusers.models import attention_dispatch

from diffusers_tpu.runtime import diffusers_private


class _Tiny(torch.nn.Module):
    def forward(self, x):
        return x + 1


class _Doubling(ModelHook):
    def new_forward(self, module, x):
        return self.fn_ref.original_forward(x) * 2


def test_a_hook_chain_is_read_without_creating_one_and_its_innermost_forward_found():
    module = _Tiny()
    assert diffusers_private.hook_registry(module) is None and diffusers_private.hook_names(module) == []
    assert diffusers_private.innermost_forward_reference(module) is None
    HookRegistry.check_if_exists_or_initialize(module).register_hook(_Doubling(), "doubling")
    assert diffusers_private.hook_names(module) == ["doubling"]
    reference, attribute = diffusers_private.innermost_forward_reference(module)
    assert float(getattr(reference, attribute)(torch.tensor(1.0))) == 2.0  # the module's own forward, unhooked
    setattr(reference, attribute, lambda x: x * 10)  # what the runtime installs there runs inside the hooks
    assert float(module(torch.tensor(1.0))) == 20.0


def test_the_active_backend_is_read_and_native_is_entered_publicly():
    before = diffusers_private.active_attention_backend()  # a stock ``set_attention_backend`` earlier sets it for good
    with diffusers.attention_backend("_native_math"):
        assert diffusers_private.active_attention_backend() == attention_dispatch.AttentionBackendName._NATIVE_MATH
        with diffusers_private.native_attention():
            assert diffusers_private.active_attention_backend() == diffusers_private.NATIVE
        assert diffusers_private.active_attention_backend() == attention_dispatch.AttentionBackendName._NATIVE_MATH
    assert diffusers_private.active_attention_backend() == before


def test_a_backend_is_served_by_another_function_until_undone():
    flex = attention_dispatch.AttentionBackendName.FLEX
    registered = attention_dispatch._AttentionBackendRegistry._backends[flex]
    calls = []

    def serving(stock):
        def served(query, key, value, **kwargs):
            calls.append(stock)
            return query

        return served

    q = torch.ones(1, 4, 2, 8)
    undo = diffusers_private.serve_backend(flex, serving)
    try:
        out = attention_dispatch.dispatch_attention_fn(q, q, q, backend=flex)
    finally:
        undo()
    assert calls == [registered] and out is q
    assert attention_dispatch._AttentionBackendRegistry._backends[flex] is registered


def test_a_processor_s_backend_is_read_and_named_and_the_active_one_made_active_again():
    processor = types.SimpleNamespace(_attention_backend=None)
    assert diffusers_private.processor_backend(processor) is None
    diffusers_private.name_processor_backend(processor, attention_dispatch.AttentionBackendName.FLEX)
    assert diffusers_private.processor_backend(processor) == attention_dispatch.AttentionBackendName.FLEX
    before = diffusers_private.active_attention_backend()
    try:
        attention_dispatch._AttentionBackendRegistry.set_active_backend(
            attention_dispatch.AttentionBackendName._NATIVE_MATH
        )
        diffusers_private.make_active(before)
        assert diffusers_private.active_attention_backend() == before
    finally:
        diffusers_private.make_active(before)


def test_a_cache_state_per_context_is_read_and_the_context_kept():
    from diffusers.hooks.hooks import BaseState, StateManager

    class _State(BaseState):
        def __init__(self):
            self.value = 0

        def reset(self):
            self.value = 0

    manager = StateManager(_State)
    assert diffusers_private.context_name(manager) is None
    diffusers_private.cache_state(manager, "uncond").value = 3  # made at first use, as stock does
    assert diffusers_private.context_name(manager) is None  # no context was left behind
    diffusers_private.set_cache_context(manager, "cond")  # as ``cache_context("cond")`` sets it
    assert diffusers_private.cache_state(manager, "uncond").value == 3 and manager.get_state().value == 0
    assert diffusers_private.context_name(manager) == "cond"
    with pytest.raises(ValueError):  # stock's error without a context: what the cached route raises too
        StateManager(_State).get_state()


def test_a_context_s_coordinates_are_read_and_a_cache_s_state_reset():
    from diffusers import MagCacheConfig, WanTransformer3DModel

    from diffusers_tpu.testing import tiny

    model = WanTransformer3DModel(**tiny.WAN_TRANSFORMERS["wan"])
    model.enable_cache(MagCacheConfig(mag_ratios=[1.0] * 2, num_inference_steps=2))
    head = diffusers_private.hook_registry(model.blocks[0]).hooks["mag_cache_leader_block_hook"]
    assert diffusers_private.context_coordinates(head.state_manager) == (None, None, None)
    if "step_index" in getattr(diffusers.hooks.hooks, "CacheContext", type).__dict__.get("__dataclass_fields__", {}):
        with model.cache_context("cond", step_index=torch.tensor(3), sigma=0.5, num_inference_steps=8):
            assert diffusers_private.context_coordinates(head.state_manager) == (3, 0.5, 8)
    diffusers_private.cache_state(head.state_manager, "cond").step_index = 1
    diffusers_private.reset_cache_hooks(model)
    assert diffusers_private.cache_state(head.state_manager, "cond").step_index == 0


def test_step_cache_hooks_expose_their_metadata_and_mag_cache_advances_its_step():
    from diffusers import MagCacheConfig, WanTransformer3DModel

    from diffusers_tpu.testing import tiny

    model = WanTransformer3DModel(**tiny.WAN_TRANSFORMERS["wan"])
    model.enable_cache(MagCacheConfig(mag_ratios=[1.0] * 2, num_inference_steps=2))
    head = diffusers_private.hook_registry(model.blocks[0]).hooks["mag_cache_leader_block_hook"]
    tail = diffusers_private.hook_registry(model.blocks[-1]).hooks["mag_cache_block_hook"]
    metadata = diffusers_private.block_metadata(head)
    assert metadata.return_hidden_states_index == 0
    hidden = torch.ones(1)
    assert diffusers_private.block_argument(metadata, "hidden_states", (hidden,), {}) is hidden
    assert diffusers_private.block_argument(metadata, "hidden_states", (), {"hidden_states": hidden}) is hidden
    state = diffusers_private.cache_state(head.state_manager, "cond")
    state.previous_residual = torch.ones(1)
    diffusers_private.advance_mag_cache_step(tail, state)
    assert state.step_index == 1 and state.previous_residual is not None
    diffusers_private.advance_mag_cache_step(tail, state)  # the schedule's end: stock resets the state
    assert state.step_index == 0 and state.previous_residual is None
