"""``runtime.call.cfg``: the guidance pair's two denoiser calls run as one batch, and only when the second call's
inputs are the batched ones (anything else runs as it came: the pairing can never change a result)."""

import contextlib
import types

import diffusers
import pytest
import torch

from diffusers_tpu import TPUConfig
from diffusers_tpu.interop import backend
from diffusers_tpu.runtime.call import cfg, hook_chain
from diffusers_tpu.testing import tiny_images
from tests.conftest import assert_np_matches

SPEC = types.SimpleNamespace(
    negative_call=0,
    pad_text=False,
    condition_args="encoder_hidden_states",
    batched_args=("hidden_states", "timestep"),
    grouped_args=(),
    negative=lambda out: out[1],
)


def _device(tensor):
    return backend.wrap(backend.host_to_jax(tensor))


def _host(tensor):
    return backend.jax_to_host(backend.to_jax_array(tensor))


def _setup():
    module = torch.nn.Identity()
    pairing = cfg.CFGPairing(SPEC)
    calls = []

    def forward(hidden_states, timestep, encoder_hidden_states):
        calls.append(hidden_states.shape[0])
        return hidden_states * 2 + encoder_hidden_states.mean(dim=(1, 2), keepdim=True)[:, :, None] + timestep

    positive, negative = torch.randn(1, 5, 4), torch.randn(1, 5, 4)
    owner = types.SimpleNamespace(forward=forward, encode_prompt=lambda: (positive, negative))
    encode = hook_chain.HookChain(owner, "encode_prompt", lambda: True)
    encode.register(pairing.negative_hook())
    context = pairing.track_context(module, lambda name, **kwargs: contextlib.nullcontext())
    paired = hook_chain.HookChain(owner, "forward", lambda: True)
    paired.register(pairing.denoiser_hook(module))
    return pairing, paired, context, encode, forward, calls


def _expected(forward, latents, step, embeds):
    return _host(forward(_device(latents), step, _device(embeds)))


def test_cond_and_uncond_run_as_one_batch_and_give_each_call_its_own_result():
    with backend.jax_mode():
        pairing, paired, context, encode, forward, calls = _setup()
        positive, negative = (_device(x) for x in encode())
        negative = pairing.negative[0]  # what the loop passes: the negative the pairing captured, on the devices
        latents, step = torch.randn(1, 3, 2, 2), _device(torch.tensor([7.0]))
        x = _device(latents)
        with context("cond"):
            cond = paired(hidden_states=x, timestep=step, encoder_hidden_states=positive)
        with context("uncond"):
            uncond = paired(hidden_states=x, timestep=step, encoder_hidden_states=negative)
        assert calls == [2] and pairing.batched_steps == 1  # one call, both halves in it
        calls.clear()
        torch.testing.assert_close(_host(cond), _expected(forward, latents, step, _host(positive)), rtol=0, atol=0)
        torch.testing.assert_close(_host(uncond), _expected(forward, latents, step, _host(negative)), rtol=0, atol=0)


def test_an_uncond_call_with_other_latents_runs_on_its_own():
    with backend.jax_mode():
        pairing, paired, context, encode, forward, calls = _setup()
        positive, _ = (_device(x) for x in encode())
        negative = pairing.negative[0]
        step = _device(torch.tensor([3.0]))
        latents, changed = torch.randn(1, 3, 2, 2), torch.randn(1, 3, 2, 2)  # a callback swapped the latents
        with context("cond"):
            paired(hidden_states=_device(latents), timestep=step, encoder_hidden_states=positive)
        with context("uncond"):
            uncond = paired(hidden_states=_device(changed), timestep=step, encoder_hidden_states=negative)
        assert calls[0] == 2 and calls[1:] == [1]  # the batched half was not used
        calls.clear()
        torch.testing.assert_close(_host(uncond), _expected(forward, changed, step, _host(negative)), rtol=0, atol=0)


def test_without_a_cache_context_or_a_negative_every_call_runs_as_it_came():
    with backend.jax_mode():
        pairing, paired, context, encode, forward, calls = _setup()
        x, step, embeds = _device(torch.randn(1, 3, 2, 2)), _device(torch.tensor([1.0])), _device(torch.randn(1, 5, 4))
        paired(hidden_states=x, timestep=step, encoder_hidden_states=embeds)  # no negative captured yet
        assert calls == [1] and pairing.batched_steps == 0
        pairing.reset()
        assert pairing.negative is None and pairing.pending is None


def _all_valid(pipe, prompt: str) -> bool:
    """Whether ``prompt``'s text states come without a mask (stock drops an all-ones one)."""
    return pipe.encode_prompt(prompt=prompt, device=torch.device("cpu"), max_sequence_length=48)[1] is None


@pytest.mark.parametrize(
    "name,negative",
    [
        ("qwen-image", "longer, no mask"),
        ("qwen-image", "as long, no mask"),
        ("nucleusmoe-image", "longer, no mask"),
        ("nucleusmoe-image", "masked"),
    ],
)
def test_a_pair_whose_masks_stock_dropped_runs_as_one_batch(name, negative):
    """A single prompt has no padding, and Qwen-Image and NucleusMoE-Image drop an all-ones mask: the pair is still one
    batch (a dropped mask made again as ones where the other half's text is longer), stock's image."""
    if name == "nucleusmoe-image" and not hasattr(diffusers, "NucleusMoEImagePipeline"):
        pytest.skip("new in diffusers 0.42")
    pipe, call = tiny_images.pipeline(name)
    candidates = [f"a red fox{'!' * k}" for k in range(24)]  # NucleusMoE-Image pads to a multiple of 8 tokens
    prompt = next((p for p in candidates if _all_valid(pipe, p)), None)
    if prompt is None:
        pytest.skip("this diffusers keeps an all-ones text mask")
    if negative == "as long, no mask":
        other = prompt.replace("fox", "box")
    else:
        other = next(p for p in candidates if len(p) > len(prompt) and _all_valid(pipe, p) == (negative != "masked"))
    call = dict(call, prompt=prompt, negative_prompt=other, output_type="np")
    expected = pipe(**call, generator=torch.Generator().manual_seed(0)).images
    pipe.to("jax", config=TPUConfig(batch_cfg=True))
    out = pipe(**call, generator=torch.Generator().manual_seed(0)).images
    assert_np_matches(out, expected)
    assert pipe._diffusers_tpu_runtime.pairing.batched_steps == call["num_inference_steps"]
