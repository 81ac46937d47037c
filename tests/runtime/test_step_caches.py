"""diffusers' step caches on JAX: the same steps skipped and the same video as stock torch with the same config."""

import ast
import copy
import re

import diffusers
import numpy as np
import pytest
import torch
from diffusers import (
    FasterCacheConfig,
    FirstBlockCacheConfig,
    MagCacheConfig,
    PyramidAttentionBroadcastConfig,
    TaylorSeerCacheConfig,
)

from diffusers_tpu import TPUConfig
from diffusers_tpu.commands import stage_timer
from diffusers_tpu.interop import backend, compile_accounting
from diffusers_tpu.runtime import diffusers_private
from diffusers_tpu.runtime.call.denoiser_hooks import HookRoute
from diffusers_tpu.testing import tiny
from tests.conftest import assert_np_matches, generate

STEPS = 6


def run(pipe, **overrides):
    return generate(pipe, **dict(dict(output_type="np", num_inference_steps=STEPS), **overrides))


def timestep_of(pipe):
    return lambda: pipe._current_timestep


CACHES = {
    "first_block": lambda pipe: FirstBlockCacheConfig(threshold=0.4),
    "mag": lambda pipe: MagCacheConfig(mag_ratios=[1.0] * STEPS, num_inference_steps=STEPS, threshold=0.5),
    "taylorseer": lambda pipe: TaylorSeerCacheConfig(
        cache_interval=2,
        disable_cache_before_step=2,
        taylor_factors_dtype=torch.float32,
        cache_identifiers=[r"blocks\.\d+\.attn\d"],
    ),
    "pyramid_attention": lambda pipe: PyramidAttentionBroadcastConfig(
        spatial_attention_block_skip_range=2,
        spatial_attention_timestep_skip_range=(100, 950),
        current_timestep_callback=timestep_of(pipe),
    ),
    "faster": lambda pipe: FasterCacheConfig(
        spatial_attention_block_skip_range=2,
        spatial_attention_timestep_skip_range=(-1, 901),
        unconditional_batch_skip_range=2,
        unconditional_batch_timestep_skip_range=(-1, 901),
        current_timestep_callback=timestep_of(pipe),
        attention_weight_callback=lambda _: 0.5,
        tensor_format="BFCHW",
        is_guidance_distilled=False,
    ),
}


if hasattr(diffusers, "SeaCacheConfig"):  # diffusers 0.42+
    # a large budget: every step stock's schedule allows is skipped (at most 2 in a row, the first and last computed)
    CACHES["sea"] = lambda pipe: diffusers.SeaCacheConfig(threshold=10.0)


@pytest.fixture(scope="module")
def uncached():
    return run(tiny.wan_pipeline("wan"))


# run in whole-step programs (``step_caches``), with their programs' count (first step, steady; TaylorSeer: its
# factors' orders, computing and predicting; SeaCache: computing, skipping with the latest residual, with two
# extrapolated); the others in units
IN_PROGRAM = {"first_block": 2, "mag": 2, "taylorseer": 4, "pyramid_attention": 2, "faster": 2, "sea": 3}
IN_PROGRAM = {name: count for name, count in IN_PROGRAM.items() if name in CACHES}
# PAB's and FasterCache's state is shared by both passes: two calls
PAIRED = tuple(name for name in ("first_block", "mag", "taylorseer", "sea") if name in CACHES)


@pytest.mark.parametrize("name", list(CACHES))
def test_cache_gives_stock_video(name, uncached, caplog):
    ref, pipe = tiny.wan_pipeline("wan"), tiny.wan_pipeline("wan")
    for p in (ref, pipe):
        p.transformer.enable_cache(CACHES[name](p))  # before the move, as GPU scripts do
    expected = run(ref)
    assert np.abs(expected - uncached).max() > 1e-2, "the cache had no effect: the test would prove nothing"
    pipe.to("jax")
    assert_np_matches(run(pipe), expected)
    entry = pipe._diffusers_tpu_runtime.denoisers["transformer"]
    before = entry.unit_calls
    with compile_accounting.compile_log() as log:
        assert_np_matches(run(pipe), expected)  # the caches' state resets between calls, as stock
    assert log.compilations == 0
    slow = [r for r in caplog.records if "the slow route" in r.getMessage()]
    if name in IN_PROGRAM:  # no block ran as its own program; the whole-step programs: computing and skipping
        assert entry.unit_calls == 0 and not slow
        (programs,) = [compiled.programs for compiled in entry._cached.values()]
        assert len(programs) == IN_PROGRAM[name]  # the two contexts' calls (cond, uncond) share them
    else:  # the unit route, said once
        assert entry.unit_calls > before and len(slow) == 1


@pytest.mark.parametrize("name", PAIRED)
def test_cached_guidance_pair_runs_as_one_batch(name):
    """With the pair batched (``batch_cfg=True`` on one device; the mesh's dp does it by itself) each half keeps its
    cache context's state: the same video and the same passes as stock, two programs, nothing recompiled."""
    ref, pipe = tiny.wan_pipeline("wan"), tiny.wan_pipeline("wan")
    for p in (ref, pipe):
        p.transformer.enable_cache(CACHES[name](p))
    expected = run(ref)
    pipe.to("jax", config=TPUConfig(batch_cfg=True))
    runtime = pipe._diffusers_tpu_runtime
    entry = runtime.denoisers["transformer"]
    assert_np_matches(run(pipe), expected)
    assert runtime.pairing.batched_steps == STEPS and entry.unit_calls == 0
    (programs,) = [compiled.programs for compiled in entry._cached.values()]
    assert len(programs) == IN_PROGRAM[name]
    first = len(entry.passes)
    with compile_accounting.compile_log() as log:
        assert_np_matches(run(pipe), expected)
    assert log.compilations == 0 and runtime.pairing.batched_steps == STEPS
    counts = entry.passes.counts(first)
    assert len(counts) == 2 * STEPS and min(counts) < max(counts)  # some passes skipped blocks


def test_first_block_cache_decides_without_reading_the_devices(monkeypatch):
    """Its decisions stay on the devices: denoiser calls read no array back (the unit route's ``.item()`` does)."""
    from jax._src.array import ArrayImpl

    pipe = tiny.wan_pipeline("wan")
    pipe.transformer.enable_cache(CACHES["first_block"](pipe))
    pipe.to("jax", config=TPUConfig(batch_cfg=True))
    entry, reads, inside = pipe._diffusers_tpu_runtime.denoisers["transformer"], [0], [False]
    value, item = ArrayImpl._value, torch.Tensor.item

    def counted(array):
        reads[0] += inside[0]
        return value.fget(array)

    def counted_item(tensor):
        reads[0] += inside[0]
        return item(tensor)

    monkeypatch.setattr(ArrayImpl, "_value", property(counted))  # an array read back
    monkeypatch.setattr(torch.Tensor, "item", counted_item)  # a torch scalar read
    for route in ("_run_cached", "_run_units"):

        def guarded(*args, _inner=getattr(entry, route), **kwargs):
            inside[0] = True
            try:
                return _inner(*args, **kwargs)
            finally:
                inside[0] = False

        monkeypatch.setattr(entry, route, guarded)
    run(pipe)
    assert reads[0] == 0 and entry.unit_calls == 0 and len(entry.passes) == 2 * STEPS
    entry._caches = {key: None for key in entry._caches}  # the unit route instead: its decision reads the devices
    run(pipe)
    assert reads[0] >= 2 * STEPS - 2  # one ``.item()`` per pass with a previous residual


def test_first_block_cache_programs_compute_each_block_once():
    """The head block runs outside the loop (its output decides) and the loop over the other blocks: the steady
    program's FLOPs (of its conditional, the larger branch) are the uncached step's, not one block more."""
    from diffusers_tpu.planner import hlo_stats

    pipe = tiny.wan_pipeline("wan-4head")
    pipe.to("jax")
    run(pipe)
    entry = pipe._diffusers_tpu_runtime.denoisers["transformer"]
    pipe.transformer.enable_cache(CACHES["first_block"](pipe))
    run(pipe)

    def flops(programs):
        return {hlo_stats.stats(p.executable.as_text()).as_dict()["total"]["flops"] for p in programs.values()}

    (uncached,) = flops(entry.whole.programs)
    (cached,) = flops(entry.cached_program(next(iter(entry._caches.values()))).programs)
    assert cached == uncached


def test_a_cache_that_cannot_be_traced_in_one_program_is_refused_once_then_runs_in_units(monkeypatch):
    """A batched pair cannot fall back mid-call (the units' stock hooks would see one context for both halves): the
    call says so, and the next one (the fix it names) runs in units, the pair as two calls, with stock's video."""
    from diffusers_tpu.interop.program import Retrace
    from diffusers_tpu.runtime.call import step_caches

    def broken(*args, **kwargs):
        raise Retrace("the chain is broken")

    ref, pipe = tiny.wan_pipeline("wan"), tiny.wan_pipeline("wan")
    for p in (ref, pipe):
        p.transformer.enable_cache(CACHES["first_block"](p))
    expected = run(ref)
    pipe.to("jax", config=TPUConfig(batch_cfg=True))
    monkeypatch.setattr(step_caches.FirstBlock, "head_called", broken)
    with pytest.raises(RuntimeError, match="Call the pipeline again"):
        run(pipe)
    assert_np_matches(run(pipe), expected)
    entry = pipe._diffusers_tpu_runtime.denoisers["transformer"]
    assert entry.unit_calls > 0 and entry.hook_route() is HookRoute.UNITS


def test_a_threshold_that_skips_nothing_computes_every_block():
    """FirstBlockCache decides inside the program: with a threshold no change passes, every pass computes all."""
    ref, pipe = tiny.wan_pipeline("wan"), tiny.wan_pipeline("wan")
    for p in (ref, pipe):
        p.transformer.enable_cache(FirstBlockCacheConfig(threshold=0.0))
    expected = run(ref)
    pipe.to("jax", config=TPUConfig(batch_cfg=True))
    assert_np_matches(run(pipe), expected)
    entry = pipe._diffusers_tpu_runtime.denoisers["transformer"]
    assert entry.passes.counts() == [2] * (2 * STEPS)


# stock's FasterCache reads the pipeline's batch as the guidance pair's halves: with one prompt and the pair as two
# calls (Wan's loop) it fails on torch too; on a pipeline that batches the pair, ``test_faster_cache_...`` below
@pytest.mark.parametrize("name", [name for name in IN_PROGRAM if name != "faster"])
def test_same_passes_skipped_as_torch_and_bench_reports_them(name):
    """The bench probe counts the blocks each denoiser pass computed: the cached passes equal torch's."""
    ref, pipe = tiny.wan_pipeline("wan"), tiny.wan_pipeline("wan")
    pipe.to("jax", config=TPUConfig(batch_cfg=True))
    reports = []
    for p in (ref, pipe):
        p.transformer.enable_cache(CACHES[name](p))  # on the moved pipeline: after the move
        report, _ = stage_timer.measure(
            p,
            dict(
                prompt="a fox",
                negative_prompt="blurry",
                height=32,
                width=32,
                num_frames=9,
                num_inference_steps=STEPS,
                output_type="pil",
            ),
            runs=1,
        )
        reports.append(report["cache"])
    torch_cache, jax_cache = reports
    paired = name in PAIRED  # one whole-step program per step, the pair batched; else one per pass
    assert jax_cache.pop("denoiser_programs_per_step") == (1.0 if paired else 2.0)
    assert jax_cache == torch_cache and 0 < jax_cache["cached_passes"] < jax_cache["denoiser_passes"]
    assert jax_cache["denoiser_passes"] == 2 * STEPS  # a batched pair counts as its two passes
    assert pipe._diffusers_tpu_runtime.pairing.batched_steps == (STEPS if paired else 0)
    for p in (ref, pipe):
        p.transformer.disable_cache()
    with compile_accounting.compile_log() as log:
        out = run(pipe)
    assert log.compilations > 0  # back to the one-program forward (compiled now: never used under the cache)
    assert_np_matches(out, run(ref))


@pytest.mark.parametrize(
    "config",
    [
        FirstBlockCacheConfig(threshold=1.5),
        MagCacheConfig(mag_ratios=[1.0] * STEPS, num_inference_steps=STEPS, threshold=0.5),
    ],
    ids=["first_block", "mag"],
)
def test_blocks_that_return_text_states_too_in_one_program(config):
    """CogVideoX's blocks return (hidden, text) states and its loop runs the pair itself in one "cond_uncond"
    context: the cache's skip gives both, as stock's; in whole-step programs, the same video."""
    call = dict(output_type="np", max_sequence_length=32, num_frames=8, num_inference_steps=STEPS)
    ref, pipe = tiny.cogvideox_pipeline("cogvideox1.5"), tiny.cogvideox_pipeline("cogvideox1.5")
    uncached = generate(ref, **call)
    for p in (ref, pipe):
        p.transformer.enable_cache(copy.deepcopy(config))
    expected = generate(ref, **call)
    assert np.abs(expected - uncached).max() > 1e-2, "the cache had no effect: the test would prove nothing"
    pipe.to("jax")
    assert_np_matches(generate(pipe, **call), expected)
    entry = pipe._diffusers_tpu_runtime.denoisers["transformer"]
    assert entry.unit_calls == 0 and min(entry.passes.counts()) < max(entry.passes.counts())  # some skipped


@pytest.mark.parametrize(
    "config",
    [
        dict(max_order=2, cache_interval=3, cache_identifiers=[r"blocks\.\d+\.(attn\d|ffn)"]),
        dict(skip_predict_identifiers=[r"blocks\.\d+\.norm2"], taylor_factors_dtype=torch.bfloat16),
        dict(use_lite_mode=True),  # every block inactive (zeros when predicting), proj_out (outside them) predicted
    ],
    ids=["second_order_attention_and_ffn", "bfloat16_factors_and_a_skipped_module", "lite_mode"],
)
def test_taylor_seer_factors_in_one_program_equal_stock(config):
    """TaylorSeer's other settings, the pair batched: the same video as stock, and stock's state objects hold the same
    factors as stock's at every step (read from the kept stacked arrays only when read)."""
    settings = dict(cache_interval=2, disable_cache_before_step=2, taylor_factors_dtype=torch.float32)
    settings["cache_identifiers"] = [r"blocks\.\d+\.attn\d"]
    settings.update(config)
    ref, pipe = tiny.wan_pipeline("wan"), tiny.wan_pipeline("wan")
    for p in (ref, pipe):
        p.transformer.enable_cache(TaylorSeerCacheConfig(**settings))
    pipe.to("jax", config=TPUConfig(batch_cfg=True))
    seen = {id(ref): [], id(pipe): []}

    def factors_of(p, step, timestep, tensors):
        from diffusers_tpu.runtime import diffusers_private

        read = p.transformer.proj_out if config.get("use_lite_mode") else p.transformer.blocks[1].attn2
        hook = diffusers_private.hook_registry(read).hooks["taylorseer_cache"]
        state = diffusers_private.cache_state(hook.state_manager, "uncond")
        orders = state.taylor_factors.get(0, {}) if not state.is_inactive else {}
        seen[id(p)].append([_host(t) for _, t in sorted(orders.items())])
        return tensors

    expected = run(ref, callback_on_step_end=factors_of)
    assert_np_matches(run(pipe, callback_on_step_end=factors_of), expected)
    entry = pipe._diffusers_tpu_runtime.denoisers["transformer"]
    assert entry.unit_calls == 0 and pipe._diffusers_tpu_runtime.pairing.batched_steps == STEPS
    (cache,) = [c for c in entry._caches.values() if c is not None]
    assert cache.loose == ({"proj_out"} if config.get("use_lite_mode") else set())  # a module outside the blocks
    for mine, stock in zip(seen[id(pipe)], seen[id(ref)], strict=True):
        assert len(mine) == len(stock)
        # stored in bfloat16, a value may round one bfloat16 step (2**-7 of its binade) apart, and the higher orders
        # (differences of order 0) inherit that step of order 0's values
        step = 2**-7 * np.abs(stock[0]).max() if "taylor_factors_dtype" in config and stock else 0
        for a, b in zip(mine, stock):
            np.testing.assert_allclose(a, b, atol=max(2e-5, step))
    assert any(len(orders) == settings.get("max_order", 1) + 1 for orders in seen[id(ref)])  # higher orders kept


def _host(tensor) -> np.ndarray:
    if backend.is_jax_tensor(tensor):
        return np.asarray(backend.to_jax_array(tensor), np.float32)
    return tensor.float().numpy()


def test_taylor_seer_predicting_before_any_update_gives_stocks_error():
    """``disable_cache_before_step=0``: stock's first step predicts from nothing and raises; so does the program route,
    before anything compiles."""
    config = dict(cache_interval=2, disable_cache_before_step=0, cache_identifiers=[r"blocks\.\d+\.attn1"])
    ref, pipe = tiny.wan_pipeline("wan"), tiny.wan_pipeline("wan")
    for p in (ref, pipe):
        p.transformer.enable_cache(TaylorSeerCacheConfig(**config))
    with pytest.raises(ValueError, match="Cannot predict without prior initialization") as stock:
        run(ref)
    pipe.to("jax")
    with compile_accounting.compile_log() as log, pytest.raises(ValueError) as mine:
        run(pipe)
    assert str(mine.value) == str(stock.value) and log.compilations == 0


def test_pyramid_attention_keeps_the_pair_as_two_calls_in_whole_step_programs():
    """Stock's PAB keeps one state per attention layer, so its uncond pass reuses what the cond pass computed: asked to
    batch the pair, the runtime keeps two calls (each a whole-step program) and gives stock's video; its automatic
    mesh does not pair over dp. What stock's state objects hold between steps (the kept attention outputs, handed back
    as stock keeps them, as before the unit route takes over) equals stock's."""
    from diffusers_tpu.runtime import diffusers_private
    from diffusers_tpu.runtime.call import denoiser

    ref, pipe = tiny.wan_pipeline("wan"), tiny.wan_pipeline("wan")
    for p in (ref, pipe):
        p.transformer.enable_cache(
            PyramidAttentionBroadcastConfig(
                spatial_attention_block_skip_range=2,
                spatial_attention_timestep_skip_range=(100, 950),
                cross_attention_block_skip_range=3,
                cross_attention_timestep_skip_range=(100, 990),
                current_timestep_callback=timestep_of(p),
            )
        )
    seen = {id(ref): [], id(pipe): []}

    def kept_of(p, step, timestep, tensors):
        if p is pipe:
            (cache,) = [c for c in p._diffusers_tpu_runtime.denoisers["transformer"]._caches.values() if c]
            cache.hand_back()
        state = diffusers_private.hook_registry(p.transformer.blocks[1].attn1).hooks["pyramid_attention_broadcast"]
        seen[id(p)].append(_host(state.state.cache))
        return tensors

    expected = run(ref, callback_on_step_end=kept_of)
    assert denoiser.runs_in_units(pipe.transformer)
    pipe.to("jax", config=TPUConfig(batch_cfg=True))
    assert_np_matches(run(pipe, callback_on_step_end=kept_of), expected)
    for mine, stock in zip(seen[id(pipe)], seen[id(ref)], strict=True):
        np.testing.assert_allclose(mine, stock, atol=2e-5)
    runtime = pipe._diffusers_tpu_runtime
    entry = runtime.denoisers["transformer"]
    assert entry.unit_calls == 0 and runtime.pairing.batched_steps == 0
    counts = entry.passes.counts()
    assert len(counts) == 2 * STEPS and len(set(counts)) == 3  # both kinds computed, one kind, none


@pytest.mark.parametrize("name", ["first_block", "mag", "taylorseer", "pyramid_attention"])
def test_caches_over_two_block_lists_run_in_whole_step_programs(name):
    """Flux's double- and single-stream lists both hooked (every cache's default there): each list one loop (FBC /
    MagCache: the head in the first, the tail residual after the second, a skip passing the second list its inputs;
    TaylorSeer / PAB: each list's layers' kept arrays), stock's image from whole-step programs, the pair batched
    (PAB: two calls)."""
    from diffusers_tpu.testing import tiny_images

    def config(p):
        if name == "first_block":
            return FirstBlockCacheConfig(threshold=0.4)
        if name == "mag":
            return MagCacheConfig(mag_ratios=[1.0] * STEPS, num_inference_steps=STEPS, threshold=0.5)
        if name == "taylorseer":
            return TaylorSeerCacheConfig(
                cache_interval=2, disable_cache_before_step=2, taylor_factors_dtype=torch.float32
            )
        return PyramidAttentionBroadcastConfig(
            spatial_attention_block_skip_range=2,
            spatial_attention_timestep_skip_range=(100, 950),
            current_timestep_callback=timestep_of(p),
        )

    (ref, call), (pipe, _), (plain, _) = tiny_images.flux(), tiny_images.flux(), tiny_images.flux()
    call = dict(call, output_type="np", num_inference_steps=STEPS)

    def image(p):
        return p(**call, generator=torch.Generator().manual_seed(0)).images

    uncached = image(plain)
    for p in (ref, pipe):
        p.transformer.enable_cache(config(p))
    expected = image(ref)
    assert np.abs(expected - uncached).max() > 1e-4, "the cache had no effect: the test would prove nothing"
    pipe.to("jax", config=TPUConfig(batch_cfg=True))
    assert_np_matches(image(pipe), expected)
    runtime = pipe._diffusers_tpu_runtime
    entry = runtime.denoisers["transformer"]
    (cache,) = [c for c in entry._caches.values() if c is not None]
    assert entry.unit_calls == 0 and cache.paths == ("transformer_blocks", "single_transformer_blocks")
    assert runtime.pairing.batched_steps == (STEPS if name in PAIRED else 0)
    counts = entry.passes.counts()
    assert len(counts) == 2 * STEPS and min(counts) < max(counts)  # some passes cached


def test_taylor_seer_factors_handed_to_an_unfinished_call_are_refused_with_the_fix(monkeypatch):
    """A computing call may reuse the old factors' memory (donated): when it did not finish, the next call says so
    before anything runs, and the fix it names (disable, then enable the cache) gives stock's video again."""
    from diffusers_tpu.runtime.call.step_caches import TaylorSeer

    config = dict(cache_interval=2, disable_cache_before_step=2, taylor_factors_dtype=torch.float32)
    config["cache_identifiers"] = [r"blocks\.\d+\.attn1"]
    ref, pipe = tiny.wan_pipeline("wan"), tiny.wan_pipeline("wan")
    for p in (ref, pipe):
        p.transformer.enable_cache(TaylorSeerCacheConfig(**config))
    expected = run(ref)
    pipe.to("jax")
    commit, calls = TaylorSeer.commit, []

    def fails_on_the_third_call(self, arrays):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt  # the call ran (its inputs donated); what it returned never stored
        return commit(self, arrays)

    monkeypatch.setattr(TaylorSeer, "commit", fails_on_the_third_call)
    with pytest.raises(KeyboardInterrupt):
        run(pipe)
    monkeypatch.setattr(TaylorSeer, "commit", commit)
    with pytest.raises(RuntimeError, match=r"disable_cache\(\), then pipe.transformer.enable_cache"):
        run(pipe)
    pipe.transformer.disable_cache()
    pipe.transformer.enable_cache(TaylorSeerCacheConfig(**config))
    assert_np_matches(run(pipe), expected)


def faster_cache(p, **settings):
    defaults = dict(
        spatial_attention_block_skip_range=2,
        spatial_attention_timestep_skip_range=(-1, 901),
        unconditional_batch_skip_range=2,
        unconditional_batch_timestep_skip_range=(-1, 901),
        current_timestep_callback=timestep_of(p),
        attention_weight_callback=lambda _: 0.3,
        tensor_format="BFCHW",
    )
    return FasterCacheConfig(**{**defaults, **settings})


@pytest.mark.parametrize("distilled", [False, True], ids=["guided", "guidance_distilled"])
def test_faster_cache_where_the_pipeline_batches_the_pair_runs_in_whole_step_programs(distilled):
    """CogVideoX runs the guidance pair as one batch, the case FasterCache is written for: on the steps it skips the
    unconditional half the denoiser gets the conditional rows and every attention layer extrapolates from its last
    two outputs (joint attention: video and text outputs), guidance-distilled on every step of its range. Stock's
    video and passes (the attention layers computed per call) from whole-step programs, nothing recompiled."""
    call = dict(output_type="np", max_sequence_length=32, num_frames=8, num_inference_steps=STEPS)
    ref, pipe, plain = (tiny.cogvideox_pipeline("cogvideox1.5") for _ in range(3))
    uncached = generate(plain, **call)
    computed = {id(ref): [], id(pipe): []}
    for p in (ref, pipe):
        # distilled: the first step computes (outside the range), later steps approximate 2 of 3
        settings = (
            dict(is_guidance_distilled=True, spatial_attention_timestep_skip_range=(-1, 999)) if distilled else {}
        )
        p.transformer.enable_cache(faster_cache(p, **settings))
    attention = [b.attn1 for b in ref.transformer.transformer_blocks]
    for module in attention:  # count stock's computed attention calls through its hook chain's innermost forward
        reference, attribute = diffusers_private.innermost_forward_reference(module)
        inner = getattr(reference, attribute)
        setattr(reference, attribute, lambda *a, _inner=inner, **k: computed[id(ref)].append(1) or _inner(*a, **k))
    expected = generate(ref, **call)
    assert np.abs(expected - uncached).max() > 1e-2, "the cache had no effect: the test would prove nothing"
    pipe.to("jax")
    assert_np_matches(generate(pipe, **call), expected)
    entry = pipe._diffusers_tpu_runtime.denoisers["transformer"]
    counts = entry.passes.counts()
    assert entry.unit_calls == 0 and sum(counts) == len(computed[id(ref)]) and min(counts) < max(counts)
    (programs,) = [compiled.programs for compiled in entry._cached.values()]
    assert len(programs) == 2  # computing (the whole batch), approximating (the conditional rows, or all)
    with compile_accounting.compile_log() as log:
        assert_np_matches(generate(pipe, **call), expected)
    assert log.compilations == 0 and entry.passes.counts(len(counts)) == counts


@pytest.mark.parametrize("name", ["faster", "pyramid_attention"])
def test_caches_on_blocks_that_cannot_be_one_loop_run_unrolled_in_whole_step_programs(name):
    """Latte interleaves its spatial and temporal blocks, so neither list can be one loop: the cached step is traced
    unrolled, each hooked attention layer (spatial and temporal) playing the cache's part on its own slice of the kept
    arrays — stock's video, no block its own program, nothing recompiled."""
    from diffusers_tpu.testing import tiny_generic

    def config(p):
        timestep = timestep_of(p)
        if name == "faster":
            return faster_cache(
                p,
                temporal_attention_block_skip_range=2,
                temporal_attention_timestep_skip_range=(-1, 901),
                tensor_format="BCFHW",
            )
        return PyramidAttentionBroadcastConfig(
            spatial_attention_block_skip_range=2,
            temporal_attention_block_skip_range=3,
            spatial_attention_timestep_skip_range=(100, 950),
            temporal_attention_timestep_skip_range=(100, 950),
            current_timestep_callback=timestep,
        )

    call = dict(tiny_generic.PROMPTS, height=16, width=16, video_length=3, output_type="np", num_inference_steps=STEPS)
    ref, pipe, plain = (tiny_generic.latte_pipeline() for _ in range(3))

    def video(p):
        return p(**call, generator=torch.Generator().manual_seed(0)).frames

    uncached = video(plain)
    for p in (ref, pipe):
        p.transformer.enable_cache(config(p))
    expected = video(ref)
    assert np.abs(expected - uncached).max() > 1e-2, "the cache had no effect: the test would prove nothing"
    pipe.to("jax")
    assert_np_matches(video(pipe), expected)
    entry = pipe._diffusers_tpu_runtime.denoisers["transformer"]
    (cache,) = [c for c in entry._caches.values() if c is not None]
    assert cache.paths == ("transformer_blocks", "temporal_transformer_blocks") and entry.unit_calls == 0
    counts = entry.passes.counts()
    assert min(counts) < max(counts)
    with compile_accounting.compile_log() as log:
        assert_np_matches(video(pipe), expected)
    assert log.compilations == 0 and entry.passes.counts(len(counts)) == counts


def _printed_ratios(out: str) -> list:
    """The ratio lists MagCache's calibration prints at the end of each context's schedule."""
    return [ast.literal_eval(line) for line in out.splitlines() if re.fullmatch(r"\[[-0-9.e, ]+\]", line.strip())]


def test_mag_cache_calibration_in_whole_step_programs(uncached, capsys):
    """``MagCacheConfig(calibrate=True)`` computes every step and prints, per context, each step's ratio of the
    residual's magnitude to the last step's: stock's video (the uncached one) and stock's ratios, from whole-step
    programs with the pair batched, nothing recompiled."""
    ref, pipe = tiny.wan_pipeline("wan"), tiny.wan_pipeline("wan")
    for p in (ref, pipe):
        p.transformer.enable_cache(MagCacheConfig(calibrate=True, num_inference_steps=STEPS))
    expected = run(ref)
    stock = _printed_ratios(capsys.readouterr().out)
    assert len(stock) == 2 and all(len(r) == STEPS and len(set(r)) > 2 for r in stock)  # cond and uncond
    assert_np_matches(expected, uncached)
    pipe.to("jax", config=TPUConfig(batch_cfg=True))
    for _ in range(2):
        with compile_accounting.compile_log() as log:
            assert_np_matches(run(pipe), expected)
        mine = _printed_ratios(capsys.readouterr().out)
        assert sorted(map(len, mine)) == [STEPS, STEPS]
        np.testing.assert_allclose(mine, stock, rtol=1e-5)
    runtime = pipe._diffusers_tpu_runtime
    entry = runtime.denoisers["transformer"]
    assert entry.unit_calls == 0 and runtime.pairing.batched_steps == STEPS and log.compilations == 0
    (programs,) = [compiled.programs for compiled in entry._cached.values()]
    assert len(programs) == 2  # the first step (nothing to measure against), then every other


@pytest.mark.skipif(not hasattr(diffusers, "SeaCacheConfig"), reason="SeaCache: diffusers 0.42+")
def test_sea_cache_pair_whose_contexts_differ_is_refused_with_the_fix(monkeypatch):
    """SeaCache gates both halves of a batched pair with the "cond" call's step and sigma: a loop that gives the
    "uncond" context others (stock gates it on its own) is refused, and the fix it names gives stock's video."""
    from diffusers.models.cache_utils import CacheMixin

    original = CacheMixin.cache_context

    def shifted(self, name, **kwargs):
        if name == "uncond" and kwargs.get("sigma") is not None:
            kwargs["sigma"] = kwargs["sigma"] * 0.5
        return original(self, name, **kwargs)

    monkeypatch.setattr(CacheMixin, "cache_context", shifted)
    ref, pipe = tiny.wan_pipeline("wan"), tiny.wan_pipeline("wan")
    for p in (ref, pipe):
        p.transformer.enable_cache(CACHES["sea"](p))
    expected = run(ref)
    pipe.to("jax", config=TPUConfig(batch_cfg=True))
    with pytest.raises(RuntimeError, match=r"(?s)'uncond' call's cache context.*batch_cfg=False"):
        run(pipe)
    pipe.to("jax", config=TPUConfig(batch_cfg=False))
    assert_np_matches(run(pipe), expected)
    assert pipe._diffusers_tpu_runtime.denoisers["transformer"].unit_calls == 0
