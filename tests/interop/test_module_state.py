"""State a module keeps on itself between calls (``interop.module_state``): carried through the compiled program, so
every call returns what stock torch returns — the old behaviour replayed the first call's stateless branch."""

import contextlib

import numpy as np
import torch

from diffusers_tpu.interop import backend, compile_accounting, jit


class Streaming(torch.nn.Module):
    """Like EasyAnimate's causal convolutions: the first call pads, later calls continue from the frames the last
    one kept (``self.previous``, a tensor that depends on the input); a rotary-style table cached on first use
    (``self.table``, from shapes only) and a one-time set-up flag (like transformers' hooks-installed flag) change
    nothing after the first call."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)
        self.previous = None
        self.table = None
        self.set_up = False

    def forward(self, x):
        if self.table is None:
            self.table = torch.arange(x.shape[-1], dtype=x.dtype)
        if not self.set_up:
            self.set_up = True
        if self.previous is None:
            context = torch.zeros_like(x[:, :1])
        else:
            context = self.previous
        self.previous = x[:, -1:].clone()
        return self.proj(torch.cat([context, x], 1)) + self.table


class Counting(torch.nn.Module):
    """A counter that changes every call's output: no one program serves the next call."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return self.proj(x) * self.calls


def active():
    stack = contextlib.ExitStack()
    stack.enter_context(backend.jax_mode())
    return stack


def on_jax(module):
    weights = {name: backend.host_to_jax(value.detach()) for name, value in module.named_parameters()}
    return jit.CompiledFunction(module, module.forward, state=lambda: weights, jax_context=active)


def test_state_between_calls_is_carried_and_a_cache_is_not():
    torch.manual_seed(0)
    stock, moved = Streaming(), Streaming()
    moved.load_state_dict(stock.state_dict())
    compiled = on_jax(moved)
    frames = [torch.randn(1, n, 4) for n in (1, 3, 3, 3)]
    with compile_accounting.compile_log() as log:
        for x in frames:
            expected = stock(x)
            got = compiled(x)
            np.testing.assert_allclose(np.asarray(backend.to_jax_array(got)), expected.detach().numpy(), atol=1e-5)
    np.testing.assert_allclose(np.asarray(backend.to_jax_array(moved.previous)), stock.previous.numpy())
    carried = {attribute for _, attribute in compiled.carried}
    assert carried == {"previous"}  # the table depends on no input: a cache, dropped after each trace
    assert moved.table is None and moved.set_up and not compiled.eager
    compilations = log.compilations
    with compile_accounting.compile_log() as log:  # the same shapes and state signature again: nothing compiles
        np.testing.assert_allclose(
            np.asarray(backend.to_jax_array(compiled(frames[-1]))), stock(frames[-1]).detach().numpy(), atol=1e-5
        )
    assert log.compilations == 0 and compilations > 0


def test_a_counter_makes_the_method_run_eagerly_with_stock_results():
    torch.manual_seed(0)
    stock, moved = Counting(), Counting()
    moved.load_state_dict(stock.state_dict())
    compiled = on_jax(moved)
    for n in range(4):
        x = torch.randn(2, 4, generator=torch.Generator().manual_seed(n))
        expected = stock(x)
        with backend.jax_mode():
            got = compiled(x)
        np.testing.assert_allclose(np.asarray(backend.to_jax_array(got)), expected.detach().numpy(), atol=1e-5)
    assert moved.calls == stock.calls == 4 and compiled.eager


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


def test_easyanimate_magvit_decode_matches_stock_through_the_runtime(frames=9):
    """EasyAnimate's VAE (diffusers' AutoencoderKLMagvit, a tiny config) decodes the first latent frame, then the
    rest through the same decoder, whose causal convolutions and temporal upsamplers keep state on themselves: 9 frames
    are a first latent frame and two more, so the decoder runs stateless once, then with its state twice."""
    from diffusers import AutoencoderKLMagvit

    torch.manual_seed(0)
    vae = AutoencoderKLMagvit(
        in_channels=3,
        out_channels=3,
        latent_channels=4,
        layers_per_block=1,
        norm_num_groups=2,
        block_out_channels=(8, 8, 8, 8),
        spatial_group_norm=False,
        down_block_types=("SpatialDownBlock3D",) + ("SpatialTemporalDownBlock3D",) * 3,
        up_block_types=("SpatialUpBlock3D",) + ("SpatialTemporalUpBlock3D",) * 3,
    ).eval()
    latents = torch.randn(1, 4, (frames - 1) // 4 + 1, 4, 4, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = vae.decode(latents).sample
    weights = {name: backend.host_to_jax(value.detach()) for name, value in vae.decoder.named_parameters()}
    weights.update({name: backend.host_to_jax(value.detach()) for name, value in vae.decoder.named_buffers()})
    post_weights = {name: backend.host_to_jax(value.detach()) for name, value in vae.post_quant_conv.named_parameters()}

    vae.decoder.forward = jit.CompiledFunction(
        vae.decoder, vae.decoder.forward, state=lambda: weights, jax_context=active
    )
    vae.post_quant_conv.forward = jit.CompiledFunction(
        vae.post_quant_conv, vae.post_quant_conv.forward, state=lambda: post_weights, jax_context=active
    )
    with torch.no_grad(), backend.jax_mode():
        got = vae.decode(backend.wrap(backend.host_to_jax(latents))).sample
    got = np.asarray(backend.to_jax_array(got))
    assert got.shape == tuple(expected.shape) and got.shape[2] == frames
    np.testing.assert_allclose(got, expected.numpy(), atol=1e-4)


def test_a_processor_put_in_place_of_another_gets_the_state_and_another_class_its_own_program():
    """SAG puts a new attention-storing processor on its UNet at every call and reads what it stored: the program
    must write the carried attention into the processor there now, not the first call's. A processor of another
    class in the same place (PAG's) is traced anew; one of the same class reuses the program."""
    from diffusers.models.attention_processor import Attention, AttnProcessor
    from diffusers.pipelines.deprecated.stable_diffusion_sag.pipeline_stable_diffusion_sag import (
        CrossAttnStoreProcessor,
    )

    torch.manual_seed(0)
    stock, moved = Attention(query_dim=8, heads=2, dim_head=4), Attention(query_dim=8, heads=2, dim_head=4)
    moved.load_state_dict(stock.state_dict())
    compiled = on_jax(moved)
    x = torch.randn(1, 6, 8)
    for call in range(3):
        stock.processor, moved.processor = CrossAttnStoreProcessor(), CrossAttnStoreProcessor()
        with compile_accounting.compile_log() as log:
            got = compiled(x)
        np.testing.assert_allclose(np.asarray(backend.to_jax_array(got)), stock(x).detach().numpy(), atol=1e-5)
        np.testing.assert_allclose(
            np.asarray(backend.to_jax_array(moved.processor.attention_probs)),
            stock.processor.attention_probs.detach().numpy(),
            atol=1e-6,
        )
        assert log.compilations == 0 or call == 0, call
    stock.processor, moved.processor = AttnProcessor(), AttnProcessor()
    with compile_accounting.compile_log() as log:
        np.testing.assert_allclose(np.asarray(backend.to_jax_array(compiled(x))), stock(x).detach().numpy(), atol=1e-5)
    assert log.compilations > 0  # another class: its own program


class SettingUpHooks(torch.nn.Module):
    """Registers a forward hook on its first call, as transformers' output capturing does: part of the program."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)
        self.hooked = False

    def forward(self, x):
        if not self.hooked:
            self.hooked = True
            self.proj.register_forward_hook(lambda module, args, output: None)
        return self.proj(x) * 2


def test_forward_hooks_run_at_every_call_as_stock_runs_them(caplog):
    """A hook registered on a submodule (SAG reads its UNet's map size through one; a user collects activations) is
    Python stock runs at every call: the method runs eagerly while it is registered, and compiled again after. A
    hook the traced code registers itself (a one-time set-up) is the program's own."""
    torch.manual_seed(0)
    stock, moved = Streaming(), Streaming()
    moved.load_state_dict(stock.state_dict())
    compiled = on_jax(moved)
    seen = {"stock": [], "jax": []}
    handles = [
        stock.proj.register_forward_hook(lambda m, a, out: seen["stock"].append(out.detach().clone())),
        moved.proj.register_forward_hook(lambda m, a, out: seen["jax"].append(out.detach().clone())),
    ]
    frames = [torch.randn(1, 3, 4) for _ in range(3)]
    with compile_accounting.compile_log() as log:
        for x in frames:
            np.testing.assert_allclose(
                np.asarray(backend.to_jax_array(compiled(x))), stock(x).detach().numpy(), atol=1e-5
            )
    assert log.compilations == 0 and compiled.hooked and "forward hooks" in caplog.text
    assert len(seen["jax"]) == len(seen["stock"]) == 3
    for got, expected in zip(seen["jax"], seen["stock"]):
        np.testing.assert_allclose(np.asarray(backend.to_jax_array(got)), expected.numpy(), atol=1e-5)
    for handle in handles:
        handle.remove()
    with compile_accounting.compile_log() as log:  # no hook left: compiled again
        compiled(frames[0])
    assert log.compilations > 0

    setting_up = SettingUpHooks()
    compiled = on_jax(setting_up)
    x = torch.randn(2, 4)
    compiled(x)
    with compile_accounting.compile_log() as log:
        np.testing.assert_allclose(
            np.asarray(backend.to_jax_array(compiled(x))), (setting_up.proj(x) * 2).detach().numpy(), atol=1e-5
        )
    assert log.compilations == 0 and not compiled.hooked
