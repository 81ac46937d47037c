"""TextKVCache (NucleusMoE-Image) in whole-step programs: the text keys and values of each block computed once per
prompt and read by the later steps' program, the guidance pair batched though the loop names no cache contexts, and
stock's image (lossless: stock's own cached and uncached images are equal)."""

import copy

import diffusers
import numpy as np
import pytest
import torch

from diffusers_tpu import TPUConfig
from diffusers_tpu.interop import compile_accounting
from diffusers_tpu.planner import hlo_stats
from diffusers_tpu.testing import tiny_images
from tests.conftest import assert_np_matches

pytestmark = pytest.mark.skipif(not hasattr(diffusers, "TextKVCacheConfig"), reason="new in diffusers 0.42")

STEPS = 4


def build(cached: bool = True, strategy: str = "leave_first_block_dense"):
    pipe, call = tiny_images.nucleusmoe_image(dense_moe_strategy=strategy)
    if cached:
        pipe.transformer.enable_cache(diffusers.TextKVCacheConfig())
    return pipe, dict(call, num_inference_steps=STEPS, output_type="np")


def run(pipe, call, **extra):
    return pipe(**copy.deepcopy(call), **extra, generator=torch.Generator().manual_seed(0)).images


def stats(program) -> dict:
    """The program's FLOPs (loop bodies times their trip counts) and loops (``planner.hlo_stats``)."""
    return hlo_stats.stats(program.executable.as_text()).as_dict()


@pytest.fixture(scope="module")
def expected():
    pipe, call = build()
    return run(pipe, call)


# a dense block then two of experts: unlike blocks, traced unrolled; three of experts: one loop
@pytest.mark.parametrize("strategy", ["leave_first_block_dense", "all_moe"])
def test_text_kv_cache_runs_in_two_programs_with_the_pair_batched(strategy, caplog):
    ref, call = build(strategy=strategy)
    expected = run(ref, call)
    pipe, _ = build(strategy=strategy)
    pipe.to("jax", config=TPUConfig(batch_cfg=True))
    runtime = pipe._diffusers_tpu_runtime
    entry = runtime.denoisers["transformer"]
    assert_np_matches(run(pipe, call), expected)
    # every step one program, cond and uncond as one batch (NucleusMoE-Image's loop names no cache contexts); the
    # text keys and values computed at the first step only: the batch's text states stay one array
    (cache,) = [c for c in entry._caches.values() if c is not None]
    assert entry.unit_calls == 0 and runtime.pairing.batched_steps == STEPS and cache.computing_calls == 1
    assert "the slow route" not in caplog.text
    keys, values = cache.inputs  # the last step's: what the reusing program reads, [layers, rows, text, heads, dim]
    layers, rows, text, heads, dim = keys.shape
    config = pipe.transformer.config
    assert (layers, rows, heads, dim) == (config.num_layers, 4, config.num_key_value_heads, config.attention_head_dim)
    programs = [stats(p) for p in next(iter(entry._cached.values())).programs.values()]
    for found in programs:  # the blocks' loop (block 0 in it when its call fits), or none: dense and expert blocks
        blocks = pipe.transformer.config.num_layers
        looped = any(loop["trip_count"] in (blocks - 1, blocks) for loop in found["loops"])
        assert looped == (strategy == "all_moe"), found["loops"]
    reusing, computing = sorted(found["total"]["flops"] + found["total"]["attention_flops"] for found in programs)
    # the reusing program skips every block's text projections (the text's own, then its keys' and values')
    width = config.num_attention_heads * config.attention_head_dim
    projections = layers * 2 * rows * text * width * (config.joint_attention_dim + 2 * heads * dim)
    assert projections <= computing - reusing <= 1.3 * projections, (computing - reusing, projections)
    with compile_accounting.compile_log() as log:  # a new call: stock's reset, the prompts' K/V computed again
        assert_np_matches(run(pipe, call), expected)
    assert log.compilations == 0 and runtime.pairing.batched_steps == STEPS and cache.computing_calls == 2
    counts = entry.passes.counts(len(entry.passes) - 2 * STEPS)
    assert counts == [config.num_layers] * (2 * STEPS)  # every block ran in both rows at every step


def test_unbatched_calls_keep_each_prompts_keys_and_values(expected):
    """The pair as two calls (one device, ``batch_cfg`` off): each prompt's keys and values computed at its first call
    and read by its later ones — the negative prompt's never taken for the positive's."""
    pipe, call = build()
    pipe.to("jax")
    entry = pipe._diffusers_tpu_runtime.denoisers["transformer"]
    assert_np_matches(run(pipe, call), expected)
    (cache,) = [c for c in entry._caches.values() if c is not None]
    assert entry.unit_calls == 0 and cache.computing_calls == 2  # cond's and uncond's, at the first step


def test_text_states_replaced_by_a_callback_are_computed_again():
    """A callback that returns new ``prompt_embeds`` mid-loop: stock's key (their ``data_ptr``) changes and it computes
    their keys and values again; so does the program route (the batch's text states are another array)."""

    def shifted(pipe, step, timestep, tensors):
        return dict(tensors, prompt_embeds=tensors["prompt_embeds"] + 1.0) if step == 1 else tensors

    extra = dict(callback_on_step_end=shifted, callback_on_step_end_tensor_inputs=["latents", "prompt_embeds"])
    ref, call = build()
    expected = run(ref, call, **extra)
    plain, _ = build(cached=False)
    np.testing.assert_array_equal(run(plain, call, **extra), expected)  # lossless in stock
    assert np.abs(expected - run(plain, call)).max() > 1e-2  # the callback changed the image
    pipe, _ = build()
    pipe.to("jax", config=TPUConfig(batch_cfg=True))
    assert_np_matches(run(pipe, call, **extra), expected)
    entry = pipe._diffusers_tpu_runtime.denoisers["transformer"]
    (cache,) = [c for c in entry._caches.values() if c is not None]
    assert cache.computing_calls == 2 and entry.unit_calls == 0  # the first step's prompts, then the new ones
