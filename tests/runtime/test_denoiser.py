"""``runtime.call.denoiser`` and ``denoiser_hooks``: which diffusers hooks a denoiser carries, the refusal of those
that cannot run on JAX (named with the call that installed them and what to use instead), and the forward a hook
chain ends in."""

import pytest
import torch
from diffusers.hooks import HookRegistry, ModelHook

from diffusers_tpu.runtime.call import denoiser, denoiser_hooks


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.block = torch.nn.Linear(2, 2)

    def forward(self, x):
        return self.block(x)


class Doubling(ModelHook):
    def post_forward(self, module, output):
        return output * 2


def test_active_hooks_lists_each_module_s_hooks_by_name():
    model = Tiny()
    assert denoiser_hooks.active_hooks(model) == {}
    HookRegistry.check_if_exists_or_initialize(model.block).register_hook(Doubling(), "doubling")
    assert denoiser_hooks.active_hooks(model) == {model.block: ["doubling"]}


def test_the_innermost_forward_is_the_stock_one_under_any_hook_chain():
    model = Tiny()
    stock = model.forward
    assert denoiser.innermost_forward(model) == stock
    HookRegistry.check_if_exists_or_initialize(model).register_hook(Doubling(), "doubling")
    x = torch.ones(1, 2)
    assert torch.equal(model(x), stock(x) * 2)  # the hook runs around it
    assert torch.equal(denoiser.innermost_forward(model)(x), stock(x))  # the forward the chain ends in


@pytest.mark.parametrize(
    "hook, named",
    [
        ("layerwise_casting", "enable_layerwise_casting"),
        ("group_offloading", "enable_group_offload"),
        ("cp_x", "enable_parallelism"),
    ],
)
def test_hooks_that_cannot_run_on_jax_are_refused_naming_the_call(hook, named):
    model = Tiny()
    HookRegistry.check_if_exists_or_initialize(model.block).register_hook(Doubling(), hook)
    with pytest.raises(ValueError, match=rf"Tiny\.block has a '{hook}' hook from {named}"):
        denoiser_hooks.check_hooks(model, "pipe.to('tpu')")
    denoiser_hooks.check_hooks(Tiny(), "pipe.to('tpu')")  # nothing registered: nothing refused
