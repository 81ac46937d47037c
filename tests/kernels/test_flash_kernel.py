"""kernels/flash.py, the project's exp2 kernel: interpret mode against a float64 reference, the traced math,
and the real (non-interpret) Mosaic lowering for TPU."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from diffusers_tpu.kernels import BlockSizes, block_for, flash_attention, reference_attention
from diffusers_tpu.planner import tpu_compiler
from tests.conftest import all_equations

SMALL = BlockSizes(block_q=256, block_kv=256, block_kv_compute=256, block_kv_compute_in=128)


def float64_attention(q, k, v, scale=None, kv_mask=None, causal=False, causal_block_size=1, q_offset=0):
    """An independent float64 numpy implementation."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    logits = np.einsum("bhqd,bhkd->bhqk", q, k) * scale
    visible = np.ones(logits.shape, bool)
    if kv_mask is not None:
        visible &= np.asarray(kv_mask, bool)[:, None, None, :]
    if causal:
        rows = (q_offset + np.arange(q.shape[2]))[:, None] // causal_block_size
        visible &= (np.arange(k.shape[2])[None, :] // causal_block_size) <= rows
    logits = np.where(visible, logits, -np.inf)
    peak = logits.max(-1, keepdims=True)
    weights = np.where(visible, np.exp(logits - np.where(np.isfinite(peak), peak, 0)), 0)
    total = weights.sum(-1, keepdims=True)
    out = np.einsum("bhqk,bhkd->bhqd", weights, v)
    return np.where(total > 0, out / np.where(total > 0, total, 1), 0)


def inputs(batch, heads, q_len, kv_len, dim, dtype=jnp.float32, seed=0):
    rng = np.random.default_rng(seed)
    return [
        jnp.asarray(rng.standard_normal(shape), dtype)
        for shape in ((batch, heads, q_len, dim), (batch, heads, kv_len, dim), (batch, heads, kv_len, dim))
    ]


def relative_error(out, ref):
    return float(np.abs(np.asarray(out, np.float64) - ref).max() / np.abs(ref).max())


def run(q, k, v, **kwargs):
    return jax.jit(lambda q, k, v: flash_attention(q, k, v, block_sizes=kwargs.pop("block_sizes", SMALL), **kwargs))(
        q, k, v
    )


SHAPES = [  # (batch, heads, Sq, Skv, D): none of the sequence lengths is a block multiple
    (2, 3, 77, 200, 16),
    (1, 2, 300, 300, 64),
    (2, 1, 1000, 13, 32),  # cross-attention: Skv << Sq
    (1, 2, 513, 640, 8),
    (2, 3, 300, 513, 128),  # head_dim a lane multiple: packed [B, S, H*D], ragged last blocks (nothing padded)
    (1, 1, 77, 300, 128),  # one head per device (heads over tp): packed rows are exactly head_dim wide
    (2, 4, 300, 513, 64),  # two 64-wide heads to a lane tile (CogVideoX, LTX): packed pairs
    (1, 8, 200, 77, 32),  # four 32-wide heads to a lane tile
]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("k_smoothing", [False, True])
def test_float32_matches_float64(shape, masked, k_smoothing):
    q, k, v = inputs(*shape)
    batch, kv_len = shape[0], shape[3]
    mask = None
    if masked:  # the two rows of a CFG pair pad differently
        mask = jnp.asarray(np.arange(kv_len)[None, :] < np.array([[kv_len // 3 + 1], [kv_len - 2]])[:batch])
    out = run(q, k, v, kv_mask=mask, scale=0.2, k_smoothing=k_smoothing)
    assert out.shape == q.shape and out.dtype == jnp.float32
    assert relative_error(out, float64_attention(q, k, v, scale=0.2, kv_mask=mask)) <= 1e-5


@pytest.mark.parametrize("shape", SHAPES[:2], ids=str)
def test_bfloat16_matches_float64(shape):
    q, k, v = inputs(*shape, dtype=jnp.bfloat16)
    out = run(q, k, v, k_smoothing=True)
    assert out.dtype == jnp.bfloat16
    assert relative_error(out, float64_attention(q, k, v)) <= 2e-2


@pytest.mark.parametrize("block_size, offset, dim", [(1, 0, 16), (4, 0, 16), (3, 500, 16), (4, 0, 128), (3, 7, 64)])
def test_causal_and_block_causal(block_size, offset, dim):
    q, k, v = inputs(2, 2, 300, 900, dim)
    out = run(q, k, v, causal=True, causal_block_size=block_size, q_offset=offset)
    ref = float64_attention(q, k, v, causal=True, causal_block_size=block_size, q_offset=offset)
    assert relative_error(out, ref) <= 1e-5
    jnp_ref = reference_attention(q, k, v, causal=True, causal_block_size=block_size, q_offset=offset)
    assert relative_error(jnp_ref, ref) <= 1e-5  # the jnp reference has the same semantics


@pytest.mark.parametrize("dim", [16, 128, 64], ids=["folded", "packed", "packed-pairs"])
@pytest.mark.parametrize("kv_len", [512, 500, 300], ids=["no-padding", "padded-last-chunk", "padded-block"])
def test_plain_chunks_equal_masked_chunks_bit_for_bit(kv_len, dim):
    """Chunks with every key visible skip the mask selects (no mask, no padding there): the result is the masked
    path's bit for bit (an all-true key mask forces the masked path everywhere) and matches float64."""
    q, k, v = inputs(2, 2, 256, kv_len, dim, seed=3)
    everything = jnp.ones((2, kv_len), bool)
    plain = np.asarray(run(q, k, v))
    masked = np.asarray(run(q, k, v, kv_mask=everything))
    assert np.array_equal(plain, masked)
    assert relative_error(plain, float64_attention(q, k, v)) < 1e-5


def test_key_mask_chunks_all_some_and_no_visible_key():
    """A key mask whose 256-key chunks are all visible (plain path), none visible (skipped) and partly visible (masked
    per key), different per batch row, with padding after them: float64's result."""
    q, k, v = inputs(2, 3, 200, 700, 16, seed=5)
    mask = np.ones((2, 700), bool)
    mask[0, 256:512] = False  # row 0: chunk 1 has no visible key
    mask[0, 600:] = False  # row 0: chunk 2 partly visible (and padded to 768)
    mask[1, :256] = False  # row 1: chunk 0 skipped, the rest visible
    out = np.asarray(run(q, k, v, kv_mask=jnp.asarray(mask)))
    assert relative_error(out, float64_attention(q, k, v, kv_mask=mask)) < 1e-5


def test_fully_masked_rows_are_zero_never_nan():
    q, k, v = inputs(3, 2, 40, 300, 8)
    mask = jnp.zeros((3, 300), bool).at[1, 250:].set(True).at[2].set(True)  # row 0: no valid key
    out = np.asarray(run(q, k, v, kv_mask=mask))
    assert np.isfinite(out).all() and not out[0].any()
    assert relative_error(out[1:], float64_attention(q, k, v, kv_mask=mask)[1:]) <= 1e-5
    early = np.asarray(run(q, k, v, causal=True, q_offset=0, kv_mask=jnp.ones((3, 300), bool).at[:, :5].set(False)))
    assert not early[:, :, :5].any() and np.isfinite(early).all()  # queries 0..4 see only masked keys


def test_default_block_sizes_on_a_long_sequence():
    q, k, v = inputs(1, 1, 3500, 3000, 16)  # the guide's 3328 x 2816 blocks, two of each, padded
    out = run(q, k, v, block_sizes=BlockSizes())
    assert relative_error(out, float64_attention(q, k, v)) <= 1e-5


def _kernel_primitives(use_exp2):
    q, k, v = inputs(1, 1, 128, 128, 8)
    traced = jax.make_jaxpr(lambda q, k, v: flash_attention(q, k, v, use_exp2=use_exp2, interpret=True))(q, k, v)
    calls = [e for e in traced.jaxpr.eqns if e.primitive.name == "pallas_call"]
    assert len(calls) == 1
    return {eqn.primitive.name for eqn in all_equations(calls[0].params["jaxpr"])}


def test_kernel_softmax_uses_exp2_and_no_exp():
    with_exp2 = _kernel_primitives(use_exp2=True)
    assert "exp2" in with_exp2 and "exp" not in with_exp2
    without = _kernel_primitives(use_exp2=False)
    assert "exp" in without and "exp2" not in without
    q, k, v = inputs(2, 2, 100, 200, 16)
    np.testing.assert_allclose(np.asarray(run(q, k, v, use_exp2=False)), np.asarray(run(q, k, v)), atol=2e-6)


def test_block_sizes():
    assert BlockSizes() == BlockSizes(3328, 2816, 256, 256)
    assert BlockSizes().fit(12, 512) == BlockSizes(128, 512, 256, 256)
    # sequences pad no further than a block of the kernel's granularity needs (Wan2.1-1.3B 480p: 32,760 tokens)
    assert BlockSizes().fit(32760, 32760) == BlockSizes(2048, 2048, 256, 256)  # 32,768, not 33,280 / 33,792
    assert BlockSizes().fit(8190, 512).block_q == 2048  # a quarter of them (cross-attention on 4 chips): 8,192
    fitted = BlockSizes().fit(75600, 75600)  # Wan 720p: within 0.5% of the least padding, the larger block
    assert fitted.block_q == fitted.block_kv == 2816 and -(-75600 // 2816) * 2816 == 76032
    for length in (9360, 17550, 32760, 45104, 75600, 80000):
        for limit in (3328, 2816):
            block = block_for(length, limit)
            assert block % 128 == 0 and limit // 2 <= block <= limit
            least = min(-(-length // b) * b for b in range(128 * (limit // 256), limit + 1, 128))
            assert -(-length // block) * block <= least * 1.005
    small = BlockSizes(4096, 4096, 512, 256).fit(75600, 75600, vmem_bytes=16 << 20)  # a v4 core's VMEM
    assert small.vmem_bytes(128, 2) <= 16 << 20 and small.block_q % 128 == small.block_kv % 128 == 0
    fitted = BlockSizes(1024, 1024, 512, 256).fit(300, 640)  # 640: compute blocks must divide it
    assert fitted == BlockSizes(384, 640, 128, 128)
    for bad in (dict(block_q=100), dict(block_kv=2816, block_kv_compute=1024), dict(block_kv_compute_in=384)):
        with pytest.raises(ValueError):
            BlockSizes(**bad)
    with pytest.raises(ValueError, match="q_offset"):
        flash_attention(*inputs(1, 1, 8, 8, 8), causal=True, q_offset=-1)


def _export(batch, heads, q_len, kv_len, dim, dtype=jnp.bfloat16, masked=False, **kwargs):
    arrays = [
        jax.ShapeDtypeStruct(s, dtype)
        for s in ((batch, heads, q_len, dim), (batch, heads, kv_len, dim), (batch, heads, kv_len, dim))
    ]
    if masked:
        arrays.append(jax.ShapeDtypeStruct((batch, kv_len), jnp.bool_))
        fn = lambda q, k, v, m: flash_attention(q, k, v, kv_mask=m, **kwargs)  # noqa: E731
    else:
        fn = lambda q, k, v: flash_attention(q, k, v, **kwargs)  # noqa: E731
    exported = jax.export.export(jax.jit(fn), platforms=["tpu"])(*arrays)
    return exported.mlir_module()


@pytest.mark.parametrize(
    "case",
    [
        dict(batch=1, heads=40, q_len=75600, kv_len=75600, dim=128),  # Wan-14B 720p self-attention
        dict(batch=1, heads=40, q_len=75600, kv_len=512, dim=128),  # its cross-attention to text
        dict(batch=2, heads=12, q_len=32760, kv_len=32760, dim=128, masked=True, k_smoothing=True),
        dict(batch=1, heads=3, q_len=1001, kv_len=77, dim=64, dtype=jnp.float32, causal=True, causal_block_size=5),
        dict(batch=2, heads=2, q_len=12, kv_len=512, dim=12, dtype=jnp.float32),  # the tiny test model
        dict(
            batch=1,
            heads=2,
            q_len=300,
            kv_len=2000,
            dim=128,
            interpret=False,
            block_sizes=BlockSizes(512, 1024, 512, 128),
        ),
    ],
    ids=["14b-720p-self", "14b-720p-cross", "1.3b-480p-masked", "causal-awkward", "tiny", "custom-blocks"],
)
def test_real_kernel_lowers_for_tpu(case):
    module = _export(**case)
    assert "tpu_custom_call" in module  # Mosaic ran: a TPU kernel was emitted


def test_benchmark_script_reports_platform_and_interpret_mode(tmp_path):
    import json

    from diffusers_tpu.kernels import benchmark

    path = tmp_path / "attention.json"
    assert (
        benchmark.main(
            [
                "--heads",
                "2",
                "--q-len",
                "200",
                "--kv-len",
                "130",
                "--head-dim",
                "16",
                "--repeats",
                "2",
                "--warmup",
                "1",
                "--json",
                str(path),
            ]
        )
        == 0
    )
    report = json.loads(path.read_text())
    assert report["platform"] == jax.default_backend() and set(report["kernels"]) == {"splash_exp2", "splash", "xla"}
    for name, entry in report["kernels"].items():
        assert entry["median_s"] > 0 and entry["max_abs_diff_vs_xla"] < 1e-4
        assert entry["interpret_mode"] == (name != "xla" and report["platform"] != "tpu")
    assert report["speed_claim"] is (report["platform"] in ("tpu", "gpu"))
    with pytest.raises(ValueError, match="not benchmarked"):
        benchmark.run(kernels=["cudnn"], q_len=128, kv_len=128)


def test_benchmark_times_torch_sdpa_and_skips_a_reference_too_large(monkeypatch):
    """``--torch`` times torch's own SDPA on the same inputs; past ``REFERENCE_SCORE_BYTES`` the float32 reference
    is not built and kernels are compared with the first one timed."""
    from diffusers_tpu.kernels import benchmark

    report = benchmark.run(
        heads=2, q_len=200, kv_len=130, head_dim=16, repeats=2, warmup=1, kernels=["xla"], torch_sdpa=True
    )
    entry = report["kernels"]["torch_sdpa"]
    assert entry["median_s"] > 0 and entry["max_abs_diff_vs_xla"] < 1e-5 and entry["interpret_mode"] is False
    monkeypatch.setattr(benchmark, "REFERENCE_SCORE_BYTES", 1)
    report = benchmark.run(
        heads=2, q_len=200, kv_len=130, head_dim=16, repeats=2, warmup=1, kernels=["splash_exp2"], torch_sdpa=True
    )
    assert "xla" not in report["kernels"] and report["kernels"]["splash_exp2"]["max_abs_diff_vs_xla"] is None
    assert report["kernels"]["torch_sdpa"]["max_abs_diff_vs_first"] < 1e-5
    assert "n/a" in benchmark.format_table(report)


@pytest.mark.parametrize(
    "heads, dim, group", [(2, 64, 2), (3, 64, 1), (1, 64, 1), (8, 32, 4), (6, 32, 1), (2, 128, 1), (4, 40, 1)]
)
def test_heads_per_block(heads, dim, group):
    """Narrow heads share a lane tile only when they fill it exactly and the grid's heads divide into such groups
    (an odd head count per device, under tp, stays folded)."""
    from diffusers_tpu.kernels.blocks import heads_per_block

    assert heads_per_block(heads, dim) == group


def test_packed_pairs_read_and_write_the_projection_layout():
    """Two 64-wide heads per grid step: the kernel's operands are ``[B, S, H*D]`` (no fold, no padding), its grid
    runs over head pairs, and its output is float64's."""
    q, k, v = inputs(2, 4, 300, 200, 64, seed=7)
    traced = jax.make_jaxpr(lambda q, k, v: flash_attention(q, k, v, block_sizes=SMALL, interpret=True))(q, k, v)
    call = next(e for e in traced.jaxpr.eqns if e.primitive.name == "pallas_call")
    assert [tuple(x.aval.shape) for x in call.invars] == [(2, 300, 256), (2, 200, 256), (2, 200, 256)]
    assert call.params["grid_mapping"].grid[0] == 2 * 4 // 2
    assert relative_error(run(q, k, v), float64_attention(q, k, v)) <= 1e-5


@pytest.mark.skipif(
    not __import__("diffusers_tpu.planner.tpu_compiler", fromlist=["x"]).available(), reason="no libtpu"
)
@pytest.mark.parametrize(
    "shape, masked, causal, dtype",
    [
        ((2, 8, 1000, 1000, 32), False, False, jnp.bfloat16),  # four heads to a lane tile
        ((1, 4, 3000, 333, 64), True, False, jnp.bfloat16),  # key mask, ragged blocks
        ((1, 2, 700, 700, 64), False, True, jnp.float32),  # causal, float32
    ],
    ids=["d32", "d64-masked", "d64-causal-f32"],
)
def test_packed_narrow_heads_compile_with_mosaic(shape, masked, causal, dtype):
    """The packed-group kernel through Mosaic's passes for a v5e chip, each code path (plain, key-masked, causal):
    one kernel call whose operands are the projections' ``[B, S, H*D]``."""
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    batch, heads, q_len, kv_len, dim = shape
    sharding = NamedSharding(Mesh(tpu_compiler.devices("v5e-1")[:1], ("x",)), P())
    q = jax.ShapeDtypeStruct((batch, heads, q_len, dim), dtype, sharding=sharding)
    kv = jax.ShapeDtypeStruct((batch, heads, kv_len, dim), dtype, sharding=sharding)
    mask = jax.ShapeDtypeStruct((batch, kv_len), jnp.bool_, sharding=sharding)
    attend = lambda q, k, v, m: flash_attention(q, k, v, kv_mask=m if masked else None, causal=causal)  # noqa: E731
    text = jax.jit(attend).lower(q, kv, kv, mask).compile().as_text()
    calls = [line for line in text.splitlines() if 'custom_call_target="tpu_custom_call"' in line]
    assert len(calls) == 1 and "diffusers_tpu_flash_attention" in calls[0]
    assert f"[{batch},{q_len},{heads * dim}]" in calls[0].split("custom-call(")[0]
