"""``runtime.call.stock_on_host``: stock methods and modules run with plain torch on the host, their results on the
devices inside a pipeline call and on the host outside one."""

import types

import torch

from diffusers_tpu.interop import backend
from diffusers_tpu.runtime.call import hook_chain, stock_on_host


def _runtime(depth: int, encoding: int = 0):
    return types.SimpleNamespace(inside_call=lambda: depth > 0, encoding_on_host=encoding)


def test_the_on_host_hook_passes_the_device_as_cpu_and_host_tensors_and_keeps_plain_lists():
    seen = {}
    prompts = ["a cat", "a dog"]

    def encode_prompt(prompt, embeds=None, device=None):
        seen.update(device=device, embeds_device=embeds.device.type, prompt=prompt)
        return embeds * 2

    embeds = torch.ones(2, 3)
    for depth, on_devices in ((0, False), (1, True)):
        runtime = _runtime(depth)
        with backend.jax_mode():
            moved = backend.wrap(backend.host_to_jax(embeds))
            chain = hook_chain.HookChain(
                types.SimpleNamespace(encode_prompt=encode_prompt), "encode_prompt", lambda: True
            )
            chain.register(stock_on_host.OnHost(encode_prompt, runtime))
            out = chain(prompts, embeds=moved, device="jax")
            assert backend.is_jax_tensor(out) is on_devices
        assert seen["device"] == torch.device("cpu") and seen["embeds_device"] == "cpu"
        assert seen["prompt"] is prompts  # the caller's own list: stock code may write into it
        assert runtime.encoding_on_host == 0


def test_on_host_runs_a_module_on_the_host_and_places_its_outputs_only_inside_a_call():
    linear = torch.nn.Linear(3, 2)
    x = torch.randn(4, 3)
    expected = linear(x)
    for depth, encoding, on_devices in ((0, 0, False), (1, 0, True), (1, 1, False)):
        runtime = _runtime(depth, encoding)
        forward = hook_chain.HookChain(linear, "forward", lambda: True)
        forward.register(stock_on_host.OnHostModule(runtime))
        with backend.jax_mode():
            out = forward(backend.wrap(backend.host_to_jax(x)))
            assert backend.is_jax_tensor(out) is on_devices
            host = backend.jax_to_host(backend.to_jax_array(out)) if on_devices else out
        torch.testing.assert_close(host, expected)


def test_parameters_names_a_method_s_parameters():
    assert stock_on_host.parameters(lambda prompt, device=None: None) == ("prompt", "device")
    assert stock_on_host.parameters(None) == ()
