"""A denoiser's repeated blocks traced as one loop (``runtime.repeated_blocks``): the program holds the block once
whatever the depth, results equal the stock loop's, and every loop it cannot keep exact runs unrolled instead."""

import contextlib

import pytest
import torch

import diffusers_tpu
from diffusers_tpu.interop import backend, compile_accounting, jit, program_figures
from diffusers_tpu.runtime.attention import sdpa
from diffusers_tpu.runtime.call import repeated_blocks
from diffusers_tpu.runtime.weights import block_signature

WIDTH = 8


class Block(torch.nn.Module):
    def __init__(self, eps=1e-5, in_place=False):
        super().__init__()
        self.norm = torch.nn.LayerNorm(WIDTH, eps=eps)
        self.fc = torch.nn.Linear(WIDTH, WIDTH)
        self.gate = torch.nn.Linear(WIDTH, WIDTH)
        self.in_place = in_place

    def forward(self, h, context, scale):
        if self.in_place:
            context.mul_(1.5)  # edits a constant argument: the next block sees the edit
        return h + self.fc(self.norm(h)) * torch.sigmoid(self.gate(context)) * scale


class PairBlock(torch.nn.Module):
    """Two carried values, returned in the other order than they are taken (as Flux's double blocks do)."""

    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(WIDTH, WIDTH), torch.nn.Linear(WIDTH, WIDTH)

    def forward(self, hidden_states, encoder_hidden_states, temb):
        h = hidden_states + torch.tanh(self.a(encoder_hidden_states)) * temb
        e = encoder_hidden_states + torch.tanh(self.b(hidden_states))
        return e, h


class Stack(torch.nn.Module):
    def __init__(self, depth, mode="chain", pairs=False):
        super().__init__()
        self.mode, self.pairs = mode, pairs
        self.inp, self.out = torch.nn.Linear(WIDTH, WIDTH), torch.nn.Linear(WIDTH, WIDTH)
        if pairs:
            self.blocks = torch.nn.ModuleList(PairBlock() for _ in range(depth))
        else:
            self.blocks = torch.nn.ModuleList(
                Block(eps=1e-3 if mode == "differs" and i == 2 else 1e-5, in_place=mode == "in_place")
                for i in range(depth)
            )
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn_like(p) * 0.5)

    def forward(self, x, context):
        h = self.inp(x)
        context = context.clone()
        scale = torch.tensor(0.7)
        if self.pairs:
            e = context
            for block in self.blocks:
                e, h = block(hidden_states=h, encoder_hidden_states=e, temb=scale)
            return self.out(h + e)
        kept = None
        for i, block in enumerate(self.blocks):
            if self.mode == "skip" and i == 2:
                continue
            h = block(h, context, scale)
            if self.mode == "residual" and i == 1:
                h = h + x
            if self.mode == "keep" and i == 1:
                kept = h
        if kept is not None:
            h = h + kept
        return self.out(h)


def on_jax(model, scan=True):
    weights = {n: backend.host_to_jax(v.detach()) for n, v in [*model.named_parameters(), *model.named_buffers()]}

    def active():
        stack = contextlib.ExitStack()
        stack.enter_context(backend.jax_mode())
        stack.enter_context(sdpa.use(sdpa.SAFE))
        return stack

    return jit.CompiledFunction(
        model,
        model.forward,
        state=lambda: weights,
        jax_context=active,
        trace_hook=repeated_blocks.scanning if scan else None,
    )


def inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(2, 5, WIDTH, generator=g), torch.randn(2, 5, WIDTH, generator=g)


def lowered_text(model, scan=True):
    return program_figures.lower(on_jax(model, scan), *inputs()).as_text()


def jax_result(model, scan=True):
    x, context = inputs()
    out = on_jax(model, scan)(x, context)
    return backend.jax_to_host(out.jax())


@pytest.mark.parametrize("pairs", [False, True])
def test_a_stack_compiles_its_block_once_and_equals_torch(pairs):
    counts = {}
    for depth in (3, 6, 9):
        model = Stack(depth, pairs=pairs)
        x, context = inputs()
        with torch.no_grad():
            expected = model(x, context)
        torch.testing.assert_close(jax_result(model), expected, rtol=0, atol=1e-5)
        text = lowered_text(model)
        assert "stablehlo.while" in text
        counts[depth] = text.count("stablehlo.dot_general")
    assert counts[3] == counts[6] == counts[9]  # block 0 and the loop body: the same program at any depth
    unrolled = lowered_text(Stack(9, pairs=pairs), scan=False)
    assert "stablehlo.while" not in unrolled and unrolled.count("stablehlo.dot_general") > counts[9]


@pytest.mark.parametrize("mode", ["residual", "skip", "keep", "in_place", "differs"])
def test_loops_that_are_not_a_plain_chain_run_as_the_stock_loop(mode):
    """A residual between blocks, a skipped block, an intermediate kept for later, a block editing its input,
    one block unlike the others: the stock result, unrolled (no loop in the program)."""
    model = Stack(6, mode)
    x, context = inputs()
    with torch.no_grad():
        expected = model(x, context)
    torch.testing.assert_close(jax_result(model), expected, rtol=0, atol=1e-5)
    assert "stablehlo.while" not in lowered_text(model)


def test_signature_sees_attributes_and_hooks():
    a, b = Block(), Block()
    assert block_signature.signature(a) == block_signature.signature(b)
    b.norm.eps = 1e-3
    assert block_signature.signature(a) != block_signature.signature(b)
    c = Block()
    c.fc.register_forward_hook(lambda *args: None)  # a closure: not provably the same as another block's
    assert block_signature.signature(a) != block_signature.signature(c)
    d = Block()
    d.forward = lambda *args: None  # one block patched by hand
    assert block_signature.signature(d) is None


def test_scan_blocks_knob():
    assert diffusers_tpu.TPUConfig().scan_blocks is True
    with pytest.raises(ValueError, match="scan_blocks"):
        diffusers_tpu.TPUConfig(scan_blocks="yes")


def test_wan_with_per_layer_lora_scales_scans_and_equals_torch(monkeypatch):
    """A real denoiser (tiny Wan, 3 blocks, all in the loop) with a LoRA whose scale differs per layer: each
    layer's own scale is picked inside the loop, and a changed scale needs no new program."""
    from diffusers_tpu.testing import tiny
    from tests.conftest import assert_np_matches, generate
    from tests.runtime.test_lora import diffusers_lora

    scans, scan = [], repeated_blocks._BlockListCalls._scan
    monkeypatch.setattr(repeated_blocks._BlockListCalls, "_scan", lambda chain: scans.append(chain.path) or scan(chain))
    ref, pipe = tiny.wan_pipeline("wan-4head"), tiny.wan_pipeline("wan-4head")
    for p in (ref, pipe):
        p.load_lora_weights(diffusers_lora("wan-4head", 1), adapter_name="a")
    pipe.to("jax")
    compiles = []

    def per_layer(p, scale):
        p.transformer.blocks[2].attn1.to_q.scaling["a"] = scale  # the last scanned block only

    for scale in (0.25, -1.5):
        per_layer(ref, scale)
        per_layer(pipe, scale)
        expected = generate(ref, output_type="np", num_inference_steps=2)
        with compile_accounting.compile_log() as log:
            got = generate(pipe, output_type="np", num_inference_steps=2)
        assert_np_matches(got, expected)
        compiles.append(log.compilations)
    assert compiles[1] == 0  # the scale is a program input
    program = next(iter(pipe._diffusers_tpu_runtime.denoisers["transformer"].whole.programs.values()))
    assert scans == ["blocks"] and program.trace_hook is repeated_blocks.scanning  # a loop, not retraced unrolled
