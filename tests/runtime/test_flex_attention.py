"""diffusers' flex backend on JAX (runtime/attention/flex_attention.py): a BlockMask made dense equals torch's flex."""

import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from diffusers_tpu.runtime.attention.flex_attention import dense_mask, flex_as_sdpa

LENGTH, BLOCK = 256, 64  # 4 x 4 blocks: some full, some partial, some empty


def chunk_causal(real: int):
    """AnyFlow FAR's shape of mask: causal over chunks of 48 tokens, padding past ``real`` seen by nobody."""

    def mask_mod(b, h, q, kv):
        return (q // 48 >= kv // 48) & (q < real) & (kv < real)

    return mask_mod


@pytest.mark.parametrize("real", [LENGTH, 200])
def test_a_dense_block_mask_is_the_mask_mod_on_its_blocks(real):
    mask = create_block_mask(chunk_causal(real), None, None, LENGTH, LENGTH, device="cpu", BLOCK_SIZE=BLOCK)
    assert mask.full_kv_num_blocks is not None and int(mask.full_kv_num_blocks.sum()) > 0  # full blocks exercised
    q, kv = torch.arange(LENGTH)[:, None], torch.arange(LENGTH)[None, :]
    assert torch.equal(dense_mask(mask)[0, 0], chunk_causal(real)(0, 0, q, kv))


def test_blocks_a_mask_leaves_out_stay_masked():
    """A mask built from blocks (NABLA's kind): only the listed blocks, whatever mask_mod allows elsewhere."""
    from torch.nn.attention.flex_attention import BlockMask

    blocks = torch.zeros(1, 2, 4, 4, dtype=torch.bool)
    blocks[0, 0].fill_diagonal_(True)
    blocks[0, 1, :, 0] = True
    mask = BlockMask.from_kv_blocks(*_ordered(blocks), BLOCK_SIZE=BLOCK, seq_lengths=(LENGTH, LENGTH))
    want = blocks.repeat_interleave(BLOCK, -2).repeat_interleave(BLOCK, -1)
    assert torch.equal(dense_mask(mask), want)


def _ordered(blocks):
    counts = blocks.sum(-1).to(torch.int32)
    indices = torch.argsort(blocks.to(torch.int8), dim=-1, descending=True, stable=True).to(torch.int32)
    return counts, indices


@pytest.mark.parametrize("real", [LENGTH, 200])
def test_flex_as_sdpa_equals_torch_flex_attention(real):
    """Same output as torch's flex attention, rows that see no key (padding) included: 0, not NaN."""
    draw = torch.Generator().manual_seed(real)
    query, key, value = (torch.randn(2, LENGTH, 4, 16, generator=draw) for _ in range(3))
    mask = create_block_mask(chunk_causal(real), None, None, LENGTH, LENGTH, device="cpu", BLOCK_SIZE=BLOCK)
    want = flex_attention(*(x.transpose(1, 2) for x in (query, key, value)), block_mask=mask).transpose(1, 2)
    got = flex_as_sdpa(query, key, value, attn_mask=mask)
    assert torch.isfinite(got).all()
    assert (got - want).abs().max() < 1e-5


def test_a_mask_of_another_size_is_refused():
    mask = create_block_mask(chunk_causal(LENGTH), None, None, LENGTH, LENGTH, device="cpu", BLOCK_SIZE=BLOCK)
    short = torch.zeros(1, 128, 2, 16)
    with pytest.raises(ValueError, match="same size"):
        flex_as_sdpa(short, short, short, attn_mask=mask)


class MaskedSum(torch.nn.Module):
    """A module given a BlockMask per call, as AnyFlow FAR's transformer is."""

    def forward(self, x, mask):
        return x * dense_mask(mask)[0, 0].float().sum(dim=-1)


def test_an_equal_block_mask_made_anew_compiles_nothing_and_another_mask_its_own_program():
    import contextlib

    from diffusers_tpu.interop import backend, compile_accounting, jit

    def active():
        stack = contextlib.ExitStack()
        stack.enter_context(backend.jax_mode())
        return stack

    module = MaskedSum()
    compiled = jit.CompiledFunction(module, module.forward, state=lambda: {}, jax_context=active)
    x = torch.ones(LENGTH)

    def run(real):  # a fresh mask object every call, as the pipeline makes it
        mask = create_block_mask(chunk_causal(real), None, None, LENGTH, LENGTH, device="cpu", BLOCK_SIZE=BLOCK)
        with backend.jax_mode():
            out = compiled(backend.wrap(backend.host_to_jax(x)), mask)
            return backend.jax_to_host(out.jax()), module(x, mask)

    got, want = run(200)
    assert torch.equal(got, want)
    with compile_accounting.compile_log() as log:
        got, want = run(200)
    assert log.compilations == 0 and len(compiled.programs) == 1 and torch.equal(got, want)
    got, want = run(LENGTH)  # another mask: another program, its own result
    assert len(compiled.programs) == 2 and torch.equal(got, want) and not torch.equal(got, run(200)[0])
