"""kernels/rotary.py: the interleaved rotary kernel against its reference, the reference against diffusers' own code,
and Mosaic's compile for TPU."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from diffusers.models.embeddings import apply_rotary_emb
from diffusers.models.transformers.transformer_wan import WanRotaryPosEmbed

from diffusers_tpu.kernels.rotary import interleaved_rotary, kernel_applies, rotary_reference
from diffusers_tpu.planner import tpu_compiler


def stock_rotary(hidden_states, freqs_cos, freqs_sin):
    """diffusers 0.42's ``apply_rotary_emb`` as written inside ``WanAttnProcessor.__call__`` (not reachable from
    outside the call), operation for operation."""
    x1, x2 = hidden_states.unflatten(-1, (-1, 2)).unbind(-1)
    cos = freqs_cos[..., 0::2]
    sin = freqs_sin[..., 1::2]
    out = torch.empty_like(hidden_states)
    out[..., 0::2] = x1 * cos - x2 * sin
    out[..., 1::2] = x1 * sin + x2 * cos
    return out.type_as(hidden_states)


def wan_tables(head_dim, frames=3, height=20, width=10):
    """Wan's own rotary tables ``[1, S, 1, D]`` for a latent of that size."""
    return WanRotaryPosEmbed(head_dim, (1, 2, 2), 1024)(torch.zeros(1, 16, frames, height, width))


def as_torch(x):
    return torch.from_numpy(np.array(x.astype(jnp.float32))).to(
        torch.bfloat16 if x.dtype == jnp.bfloat16 else torch.float32
    )


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("head_dim", [128, 16])
def test_reference_is_diffusers_rotary_bit_for_bit(dtype, head_dim):
    freqs_cos, freqs_sin = wan_tables(head_dim)
    x = jnp.asarray(np.random.default_rng(0).standard_normal((2, freqs_cos.shape[1], 3, head_dim)), dtype)
    want = stock_rotary(as_torch(x), freqs_cos, freqs_sin).float().numpy()
    got = rotary_reference(x, jnp.asarray(freqs_cos.numpy()), jnp.asarray(freqs_sin.numpy()))
    assert got.dtype == dtype
    np.testing.assert_array_equal(np.asarray(got.astype(jnp.float32)), want)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_lanes_reference_is_diffusers_apply_rotary_emb_bit_for_bit(dtype):
    """``tables="lanes"``: diffusers' shared ``apply_rotary_emb`` (HunyuanVideo's call: ``sequence_dim=1``), with
    general tables (the two lanes of a pair differ)."""
    rng = np.random.default_rng(4)
    x = jnp.asarray(rng.standard_normal((2, 40, 3, 128)), dtype)
    cos, sin = (rng.standard_normal((40, 128)).astype(np.float32) for _ in range(2))
    want = apply_rotary_emb(as_torch(x), (torch.from_numpy(cos), torch.from_numpy(sin)), sequence_dim=1)
    got = rotary_reference(x, jnp.asarray(cos), jnp.asarray(sin), tables="lanes")
    np.testing.assert_array_equal(np.asarray(got.astype(jnp.float32)), want.float().numpy())


@pytest.mark.parametrize("tables", ["pairs", "lanes"])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("heads, head_dim", [(3, 128), (4, 64)], ids=["d128", "d64-pairs"])
def test_kernel_matches_the_reference_on_ragged_blocks_and_general_tables(dtype, tables, heads, head_dim, monkeypatch):
    """Interpret mode: 2 batch rows, 300 tokens in blocks of 128 (a ragged last block), and tables whose two lanes of
    a pair differ ("pairs" must take cos from the even lane and sin from the odd one, "lanes" each lane's own); heads
    of 128, and of 64 (CogVideoX's: two to a lane tile, the tables repeated per head)."""
    from diffusers_tpu.kernels import rotary as kernel

    calls, pallas = [], kernel._pallas_rotary
    monkeypatch.setattr(
        kernel, "_pallas_rotary", lambda flat, *a, **kw: calls.append(flat[0].shape) or pallas(flat, *a, **kw)
    )
    rng = np.random.default_rng(1)
    q, k = (jnp.asarray(rng.standard_normal((2, 300, heads, head_dim)), dtype) for _ in range(2))
    cos, sin = (jnp.asarray(rng.standard_normal((300, head_dim)), jnp.float32) for _ in range(2))
    got_q, got_k = interleaved_rotary(q, k, cos=cos, sin=sin, tables=tables, interpret=True, block_rows=128)
    assert calls == [(2, 300, heads * head_dim)]  # the kernel, on the projections' layout
    for got, x in ((got_q, q), (got_k, k)):
        want = np.asarray(rotary_reference(x, cos, sin, tables).astype(jnp.float32))
        got = np.asarray(got.astype(jnp.float32))
        assert got.shape == x.shape and np.isfinite(got).all()
        # float32: the interpreter may fuse a multiply-add (one rounding fewer); bfloat16: then one level apart
        step = 2.0**-23 if dtype == jnp.float32 else 2.0**-7
        np.testing.assert_allclose(got, want, rtol=2 * step, atol=8 * step)
        if dtype == jnp.bfloat16:
            assert np.mean(got != want) < 0.01
    swapped = interleaved_rotary(q, cos=cos, sin=-sin, tables=tables, interpret=True, block_rows=128)[0]
    assert np.abs(np.asarray(swapped, np.float32) - np.asarray(got_q, np.float32)).max() > 0.1  # sin's sign matters


def test_shapes_the_kernel_does_not_take_use_the_reference():
    freqs_cos, freqs_sin = wan_tables(64)
    cos, sin = jnp.asarray(freqs_cos[0, :, 0].numpy()), jnp.asarray(freqs_sin[0, :, 0].numpy())
    x = jnp.asarray(np.random.default_rng(2).standard_normal((1, cos.shape[0], 3, 64)), jnp.float32)  # 3 x 64 lanes
    assert not kernel_applies(x, cos) and kernel_applies(jnp.zeros((1, 5, 2, 128)), jnp.zeros((5, 128)))
    np.testing.assert_array_equal(interleaved_rotary(x, cos=cos, sin=sin)[0], rotary_reference(x, cos, sin))
    with pytest.raises(ValueError, match=r"tables='complex'; choose one of \['pairs', 'lanes'\]"):
        interleaved_rotary(x, cos=cos, sin=sin, tables="complex")


@pytest.mark.skipif(not tpu_compiler.available(), reason="libtpu (the TPU compiler) not installed")
@pytest.mark.parametrize("tables", ["pairs", "lanes"])
@pytest.mark.parametrize("chip", ["v5e-1", "v6e-1"])
@pytest.mark.parametrize("shape", [(1, 32760, 3, 128), (1, 45106, 12, 64)], ids=["wan-480p", "cogvideox1.5-5b"])
def test_mosaic_compiles_the_kernel_at_real_shapes(chip, tables, shape):
    """Wan2.1-1.3B 480p self-attention on one device of tp4 (32,760 tokens x 3 heads of 128) and CogVideoX1.5-5B's
    joint tokens on one of tp4 (45,106 x 12 heads of 64, two to a lane tile): q and k in one kernel call."""
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    devices = tpu_compiler.devices(chip)
    sharding = NamedSharding(Mesh(devices[:1], ("x",)), P())
    x = jax.ShapeDtypeStruct(shape, jnp.bfloat16, sharding=sharding)
    table = jax.ShapeDtypeStruct(shape[1:2] + shape[3:], jnp.float32, sharding=sharding)
    rotate = lambda q, k, c, s: interleaved_rotary(q, k, cos=c, sin=s, tables=tables)  # noqa: E731
    text = jax.jit(rotate).lower(x, x, table, table).compile().as_text()
    calls = [line for line in text.splitlines() if 'custom_call_target="tpu_custom_call"' in line]
    assert len(calls) == 1 and "diffusers_tpu_rotary" in calls[0]


_ON_THE_MESH = r"""
import os
os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
import jax, jax.numpy as jnp, numpy as np
from diffusers_tpu.interop import backend
from diffusers_tpu.kernels import rotary as kernel
from diffusers_tpu.kernels.rotary import rotary_reference
from diffusers_tpu.runtime.attention import rotary, sdpa
calls, pallas = [], kernel._pallas_rotary
kernel._pallas_rotary = lambda *a, **k: calls.append(1) or pallas(*a, **k)
rng = np.random.default_rng(3)
worst = 0.0
cases = (({"dp": 2, "sp": 2, "tp": 2}, 50, 128), ({"sp": 8}, 45, 128), ({"dp": 1, "sp": 1, "tp": 8}, 16, 128),
         ({"dp": 2, "sp": 2, "tp": 2}, 50, 64))  # 64: two heads per device, one lane tile
for shape, tokens, dim in cases:
    mesh = backend.build_mesh(shape, jax.devices())
    settings = sdpa.AttentionSettings(mesh=mesh, implementation="splash_exp2")
    q, k = (jnp.asarray(rng.standard_normal((2, tokens, 4, dim)), jnp.float32) for _ in range(2))
    cos, sin = (jnp.asarray(rng.standard_normal((1, tokens, 1, dim)), jnp.float32) for _ in range(2))
    text = rotary._rotate_jitted.lower((q, k), cos, sin, settings=settings).as_text()
    assert "manual_computation" in text and calls, "not the kernel under shard_map"
    calls.clear()
    for tables in ("pairs", "lanes"):
        got = rotary._rotate_jitted((q, k), cos, sin, tables=tables, settings=settings)
        for g, x in zip(got, (q, k)):
            assert g.shape == x.shape
            worst = max(worst, float(jnp.abs(g - rotary_reference(x, cos, sin, tables)).max()))
print("WORST", worst)
"""


def test_the_seam_shards_the_kernel_over_the_mesh_and_pads_uneven_tokens():
    """``runtime.rotary`` on 8 simulated devices: batch/tokens/heads sharded (dp2·sp2·tp2; heads of 128 and of 64),
    tokens not divisible by sp (45 over a mesh of sp 8 alone: padded, then cut), 4 heads over tp 8 (tp left out);
    each equal to the reference (the kernel interpreted)."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _ON_THE_MESH], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    worst = float(done.stdout.split("WORST")[-1])
    assert worst < 1e-5, worst
