"""State a module keeps on itself between calls (``interop.module_state``): carried through the compiled program, so
every call returns what stock torch returns — the old behaviour replayed the first call's stateless branch."""

import contextlib

import numpy as np
import pytest
import torch

from diffusers_tpu.interop import backend, compile as jit


class Streaming(torch.nn.Module):
    """Like EasyAnimate's causal convolutions: the first call pads, later calls continue from the frames the last
    one kept (``self.previous``, a tensor that depends on the input); a counter changes the output too; a rotary-
    style table cached on first use (``self.table``, from shapes only) changes nothing."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)
        self.previous = None
        self.calls = 0
        self.table = None

    def forward(self, x):
        if self.table is None:
            self.table = torch.arange(x.shape[-1], dtype=x.dtype)
        if self.previous is None:
            context = torch.zeros_like(x[:, :1])
        else:
            context = self.previous
        self.previous = x[:, -1:].clone()
        self.calls += 1
        return self.proj(torch.cat([context, x], 1)) * self.calls + self.table


def on_jax(module):
    weights = {name: backend.host_to_jax(value.detach()) for name, value in module.named_parameters()}

    def active():
        stack = contextlib.ExitStack()
        stack.enter_context(backend.jax_mode())
        return stack

    return jit.compiled_function(module, module.forward, state=lambda: weights, activate=active)


def test_state_between_calls_is_carried_and_a_cache_is_not():
    torch.manual_seed(0)
    stock, moved = Streaming(), Streaming()
    moved.load_state_dict(stock.state_dict())
    compiled = on_jax(moved)
    frames = [torch.randn(1, n, 4) for n in (1, 3, 3, 3)]
    with jit.compile_log() as log:
        for x in frames:
            expected = stock(x)
            got = compiled(x)
            np.testing.assert_allclose(np.asarray(backend.to_jax_array(got)), expected.detach().numpy(), atol=1e-5)
    assert moved.calls == stock.calls == 4
    np.testing.assert_allclose(np.asarray(backend.to_jax_array(moved.previous)), stock.previous.numpy())
    carried = {attribute for _, attribute in compiled.carried}
    assert carried == {"previous", "calls"}  # the table depends on no input: a cache, dropped after each trace
    assert moved.table is None and not compiled.eager
    compilations = log.compilations
    with jit.compile_log() as log:  # the same shapes and state signature again: nothing compiles
        moved.calls = stock.calls = 3
        np.testing.assert_allclose(np.asarray(backend.to_jax_array(compiled(frames[-1]))),
                                   stock(frames[-1]).detach().numpy(), atol=1e-5)
    assert log.compilations == 0 and compilations > 0


class Collecting(torch.nn.Module):
    """Keeps every call's input in a list on itself: no program can carry that."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)
        self.seen = None

    def forward(self, x):
        self.seen = [x * 2] if self.seen is None else [*self.seen, x * 2]
        return self.proj(sum(self.seen))


def test_state_no_program_can_carry_runs_eagerly_with_stock_results(caplog):
    torch.manual_seed(0)
    stock, moved = Collecting(), Collecting()
    moved.load_state_dict(stock.state_dict())
    compiled = on_jax(moved)
    with caplog.at_level("WARNING"):
        for n in range(3):
            x = torch.randn(2, 4, generator=torch.Generator().manual_seed(n))
            expected = stock(x)
            with backend.jax_mode():
                got = compiled(x)
            np.testing.assert_allclose(np.asarray(backend.to_jax_array(got)), expected.detach().numpy(), atol=1e-5)
    assert compiled.eager and "runs eagerly" in caplog.text and len(moved.seen) == 3


@pytest.mark.parametrize("frames", [5, 9])
def test_easyanimate_magvit_decode_matches_stock_through_the_runtime(frames):
    """EasyAnimate's VAE (diffusers' AutoencoderKLMagvit, a tiny config) decodes the first latent frame, then the
    rest through the same decoder, whose causal convolutions and temporal upsamplers keep state on themselves."""
    from diffusers import AutoencoderKLMagvit

    torch.manual_seed(0)
    vae = AutoencoderKLMagvit(in_channels=3, out_channels=3, latent_channels=4, layers_per_block=1, norm_num_groups=2,
                              block_out_channels=(8, 8, 8, 8), spatial_group_norm=False,
                              down_block_types=("SpatialDownBlock3D",) + ("SpatialTemporalDownBlock3D",) * 3,
                              up_block_types=("SpatialUpBlock3D",) + ("SpatialTemporalUpBlock3D",) * 3).eval()
    latents = torch.randn(1, 4, (frames - 1) // 4 + 1, 4, 4, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = vae.decode(latents).sample
    weights = {name: backend.host_to_jax(value.detach()) for name, value in vae.decoder.named_parameters()}
    weights.update({name: backend.host_to_jax(value.detach()) for name, value in vae.decoder.named_buffers()})
    post_weights = {name: backend.host_to_jax(value.detach()) for name, value in vae.post_quant_conv.named_parameters()}

    def active():
        stack = contextlib.ExitStack()
        stack.enter_context(backend.jax_mode())
        return stack

    vae.decoder.forward = jit.compiled_function(vae.decoder, vae.decoder.forward, state=lambda: weights,
                                                activate=active)
    vae.post_quant_conv.forward = jit.compiled_function(vae.post_quant_conv, vae.post_quant_conv.forward,
                                                        state=lambda: post_weights, activate=active)
    with torch.no_grad(), backend.jax_mode():
        got = vae.decode(backend.wrap(backend.host_to_jax(latents))).sample
    got = np.asarray(backend.to_jax_array(got))
    assert got.shape == tuple(expected.shape) and got.shape[2] == frames
    np.testing.assert_allclose(got, expected.numpy(), atol=1e-4)
