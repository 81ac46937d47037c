"""Causal Wan: block-by-block generation over the static ring-buffer KV cache equals one full-sequence forward
with the equivalent block-causal mask, on torch and on JAX (the project's kernel), with one compiled program."""

import contextlib

import pytest
import torch

from diffusers_tpu.families.causal_wan import CausalWanTransformer3DModel, visible_frames
from diffusers_tpu.interop import backend, compile_accounting, jit, user_tensors
from diffusers_tpu.runtime.attention import sdpa
from diffusers_tpu.testing import tiny

# (frames per block, sinks, window, latent frames): the first wraps the ring (4 blocks, 3-frame window + 1 sink).
CASES = [(2, 1, 3, 8), (3, 0, -1, 6), (1, 2, 2, 6)]


def _model(per_block, sink, local):
    wan = tiny.wan_pipeline("wan-4head").transformer
    return CausalWanTransformer3DModel.from_transformer(
        wan, num_frame_per_block=per_block, sink_size=sink, local_attn_size=local
    ), wan


def _inputs(frames, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(2, 16, frames, 4, 6, generator=g),
        torch.tensor([500.0, 500.0]),
        torch.randn(2, 7, 32, generator=g),
    )


def _blockwise(forward, model, x, t, text, per_block, tokens_per_frame, as_offset=int):
    cache = model.new_kv_cache(x.shape[0], tokens_per_frame, max_frames=x.shape[2])
    outs, logs = [], []
    for start in range(0, x.shape[2], per_block):
        with compile_accounting.compile_log() as log:
            out, cache = forward(x[:, :, start : start + per_block], t, text, cache, as_offset(start))
        outs.append(user_tensors.to_host(out))
        logs.append(log.compilations)
    return torch.cat(outs, 2), user_tensors.to_host(cache), logs


@pytest.mark.parametrize("per_block, sink, local, frames", CASES)
def test_kv_cache_blocks_equal_the_full_block_causal_forward(per_block, sink, local, frames):
    model, wan = _model(per_block, sink, local)
    x, t, text = _inputs(frames)
    with torch.no_grad():
        full = model(x, t, text, return_dict=False)[0]
        forward = lambda *a: model(*a[:3], kv_cache=a[3], frame_offset=a[4], write_cache=True)  # noqa: E731
        blocks, cache, _ = _blockwise(forward, model, x, t, text, per_block, tokens_per_frame=2 * 3)
        assert (full - wan(x, t, text, return_dict=False)[0]).abs().max() > 1e-2  # the mask matters
    torch.testing.assert_close(blocks, full, rtol=0, atol=1e-4)
    kept = cache["slot_frame"].tolist()
    assert kept[:sink] == list(range(sink))  # sinks are never overwritten
    if local > 0:  # the ring holds the last `local` frames
        assert sorted(kept[sink:]) == list(range(frames - local, frames))


def test_visible_frames_rule():
    seen = visible_frames(8, 2, 1, 3)
    assert seen[6].tolist() == [True, False, False, True, True, True, True, True]  # sink, frames 3-5, own block 6-7
    assert seen[1].tolist() == [True, True] + [False] * 6


def _on_jax(model, implementation="splash_exp2", dtype=None):
    """A compiled block forward (weights as program arguments), as the runtime compiles denoisers."""
    weights = {
        name: backend.host_to_jax(value.detach().to(dtype or value.dtype))
        for name, value in [*model.named_parameters(), *model.named_buffers()]
    }
    settings = sdpa.AttentionSettings(None, implementation)

    def active():
        stack = contextlib.ExitStack()
        stack.enter_context(backend.jax_mode())
        stack.enter_context(sdpa.use(settings))
        return stack

    return jit.CompiledFunction(
        model,
        lambda x, t, e, cache, offset: model(x, t, e, kv_cache=cache, frame_offset=offset, write_cache=True),
        state=lambda: weights,
        jax_context=active,
    )


def test_jax_path_equals_torch_and_compiles_once():
    model, _ = _model(2, 1, 3)
    x, t, text = _inputs(8)
    with torch.no_grad():
        reference = model(x, t, text, return_dict=False)[0]
    offset = lambda start: torch.tensor(start, dtype=torch.int32)  # noqa: E731  (a traced position)
    blocks, cache, compilations = _blockwise(_on_jax(model), model, x, t, text, 2, 6, as_offset=offset)
    torch.testing.assert_close(blocks, reference, rtol=0, atol=1e-4)
    assert compilations[0] > 0 and compilations[1:] == [0, 0, 0]  # one program serves every later block
    assert cache["slot_frame"].tolist() == [0, 7, 5, 6]


def test_config_errors_and_checkpoint_loading(tmp_path):
    wan = tiny.wan_pipeline("wan-4head").transformer
    with pytest.raises(ValueError, match="local_attn_size=2 must be -1"):
        CausalWanTransformer3DModel.from_transformer(wan, num_frame_per_block=3, local_attn_size=2)
    with pytest.raises(ValueError, match="max_frames"):
        CausalWanTransformer3DModel.from_transformer(wan).new_kv_cache(1, 4)
    wan.save_pretrained(str(tmp_path), safe_serialization=True)
    loaded = CausalWanTransformer3DModel.from_pretrained(str(tmp_path), num_frame_per_block=2, sink_size=1)
    assert loaded.config.num_frame_per_block == 2 and loaded.config.sink_size == 1
    assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), wan.state_dict().values()))


def test_bf16_cache_path():
    """bf16: the cache path equals the bf16 full-sequence reference (same attention math: the issue's bar, max 1e-2 /
    mean 1e-3, holds with zero error); with the exp2 kernel, whose bf16 roundings (pre-scaled queries, bf16
    probabilities into the PV matmul, as flash kernels do) move it off that reference, the error against fp32
    stays at torch bf16's own level."""
    model, _ = _model(2, 1, 3)
    x, t, text = _inputs(8)
    offset = lambda start: torch.tensor(start, dtype=torch.int32)  # noqa: E731
    with torch.no_grad():
        fp32 = model(x, t, text, return_dict=False)[0]
    xb, textb = x.bfloat16(), text.bfloat16()
    weights = {
        n: backend.host_to_jax(v.detach().bfloat16()) for n, v in [*model.named_parameters(), *model.named_buffers()]
    }

    def active():
        stack = contextlib.ExitStack()
        stack.enter_context(backend.jax_mode())
        stack.enter_context(sdpa.use(sdpa.AttentionSettings(None, "xla")))
        return stack

    full = jit.CompiledFunction(
        model, lambda *a: model(*a, return_dict=False)[0], state=lambda: weights, jax_context=active
    )
    reference = user_tensors.to_host(full(xb, t, textb)).float()
    cached = _blockwise(_on_jax(model, "xla", torch.bfloat16), model, xb, t, textb, 2, 6, as_offset=offset)[0].float()
    assert cached.dtype == reference.dtype and (cached - reference).abs().max() <= 1e-2
    assert (cached - reference).abs().mean() <= 1e-3
    kernel = _blockwise(_on_jax(model, "splash_exp2", torch.bfloat16), model, xb, t, textb, 2, 6, as_offset=offset)[0]
    with torch.no_grad():
        model.to(torch.bfloat16)
        torch_bf16 = model(xb, t, textb, return_dict=False)[0].float()
    ours, theirs = (kernel.float() - fp32).abs(), (torch_bf16 - fp32).abs()
    assert ours.mean() <= 1.1 * theirs.mean() and ours.max() <= 2 * theirs.max(), (ours.max(), theirs.max())
