"""The SDPA override: torch semantics, routed to the kernels, sharded by kv length."""

import types

import jax
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from jax.sharding import PartitionSpec as P

from diffusers_tpu.interop import backend
from diffusers_tpu.interop.backend import host_to_jax, wrap
from diffusers_tpu.runtime.attention import sdpa


def settings(implementation="splash_exp2", threshold=64):
    mesh = backend.build_mesh({"dp": 1, "sp": 1, "tp": 1}, jax.devices()[:1])
    return sdpa.AttentionSettings(mesh, implementation, threshold)


def run_on_jax(config, *tensors, **kwargs):
    with backend.jax_mode(), sdpa.use(config):
        args = [wrap(host_to_jax(t)) for t in tensors]
        mask = kwargs.get("attn_mask")
        if mask is not None:
            kwargs["attn_mask"] = wrap(host_to_jax(mask))
        out = F.scaled_dot_product_attention(*args, **kwargs)
    return backend.jax_to_host(out.jax())


def rand(*shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(sum(shape)))


CASES = {
    "plain": ((2, 3, 40, 16), (2, 3, 90, 16), {}),
    "key_padding": (
        (2, 3, 40, 16),
        (2, 3, 90, 16),
        {"attn_mask": torch.arange(90)[None, None, None, :] < torch.tensor([30, 90])[:, None, None, None]},
    ),
    "dense_bool": (
        (2, 3, 40, 16),
        (2, 3, 90, 16),
        {"attn_mask": torch.rand(2, 3, 40, 90, generator=torch.Generator().manual_seed(0)) > 0.2},
    ),
    "float_bias": ((2, 3, 40, 16), (2, 3, 90, 16), {"attn_mask": rand(1, 3, 40, 90)}),
    "causal": ((2, 3, 40, 16), (2, 3, 40, 16), {"is_causal": True}),
    "scale": ((1, 2, 7, 8), (1, 2, 300, 8), {"scale": 0.05}),
    "gqa": ((2, 4, 20, 8), (2, 2, 70, 8), {"enable_gqa": True}),
    "three_dims": ((3, 20, 8), (3, 70, 8), {}),
    "no_keys": ((1, 2, 5, 8), (1, 2, 0, 8), {}),  # Wan-Animate's image context when it is empty: zeros, as torch
}


@pytest.mark.parametrize("implementation", ["splash_exp2", "splash", "xla"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_override_matches_torch(case, implementation):
    q_shape, kv_shape, kwargs = CASES[case]
    q, k, v = rand(*q_shape), rand(*kv_shape), rand(*kv_shape) + 1
    expected = F.scaled_dot_product_attention(q, k, v, **kwargs)
    out = run_on_jax(settings(implementation), q, k, v, **dict(kwargs))
    assert out.shape == expected.shape
    torch.testing.assert_close(out, expected, atol=3e-6, rtol=1e-5)


def test_outside_a_pipeline_sdpa_is_the_safe_reference():
    """VAE, text encoders and any torchax code: exact, and a fully masked row is 0 (torchax's own SDPA: NaN)."""
    q, k, v = rand(2, 2, 10, 8), rand(2, 2, 12, 8), rand(2, 2, 12, 8)
    mask = torch.ones(2, 1, 1, 12, dtype=torch.bool)
    mask[0] = False
    with backend.jax_mode():
        out = F.scaled_dot_product_attention(
            *(wrap(host_to_jax(t)) for t in (q, k, v)), attn_mask=wrap(host_to_jax(mask))
        )
    out = backend.jax_to_host(out.jax())
    assert torch.isfinite(out).all() and not out[0].any()
    torch.testing.assert_close(out[1], F.scaled_dot_product_attention(q, k, v)[1], atol=3e-6, rtol=1e-5)


def test_cudnn_wrapper_semantics_through_its_xla_fallback():
    """cuDNN itself needs an NVIDIA GPU; the wrapper's layout, masking and zero rows are checked on CPU."""
    from diffusers_tpu.kernels import cudnn_attention, reference_attention

    q, k, v = (host_to_jax(rand(2, 3, 20 + i, 16)[:, :, :20] if i == 0 else rand(2, 3, 33, 16)) for i in range(3))
    mask = host_to_jax(torch.arange(33)[None] < torch.tensor([[0], [17]]))
    out = np.asarray(cudnn_attention(q, k, v, kv_mask=mask, scale=0.3, implementation=None))
    ref = np.asarray(reference_attention(q, k, v, kv_mask=mask, scale=0.3))
    assert not out[0].any()
    np.testing.assert_allclose(out, ref, atol=3e-6)


def test_attention_choice_must_fit_the_platform():
    from diffusers_tpu import TPUConfig

    assert TPUConfig().attention_for("tpu") == "splash_exp2" and TPUConfig().attention_for("cpu") == "splash_exp2"
    assert TPUConfig().attention_for("gpu") == "cudnn"
    with pytest.raises(ValueError, match="needs an NVIDIA GPU"):
        TPUConfig(attention="cudnn").attention_for("cpu")
    with pytest.raises(ValueError, match="cannot run on a GPU"):
        TPUConfig(attention="splash_exp2").attention_for("gpu")


def fake_settings(threshold=100, **axes):
    shape = {"dp": 1, "sp": 1, "tp": 1} | axes
    return sdpa.AttentionSettings(types.SimpleNamespace(shape=shape), "xla", threshold)


def test_long_kv_shards_heads_short_kv_shards_the_query_sequence():
    config = fake_settings(dp=2, sp=2, tp=2)
    q_spec, kv_spec, mask_spec, seq = sdpa.specs((4, 6, 1000, 64), 1000, config)
    assert (q_spec, kv_spec, mask_spec, seq) == (
        P("dp", "tp", "sp", None),
        P("dp", "tp", None, None),
        P("dp", None),
        "sp",
    )
    q_spec, kv_spec, _, seq = sdpa.specs((4, 6, 1000, 64), 99, config)
    assert (q_spec, kv_spec, seq) == (P("dp", None, ("sp", "tp"), None), P("dp", None, None, None), ("sp", "tp"))


def test_axes_that_do_not_divide_are_dropped():
    config = fake_settings(dp=2, tp=4)
    q_spec, kv_spec, mask_spec, _ = sdpa.specs((1, 6, 1000, 64), 1000, config)  # batch 1, 6 heads
    assert q_spec == P(None, None, "sp", None) and kv_spec == P(None, None, None, None) and mask_spec == P(None, None)


_VAE_MID_BLOCK_ON_A_MESH = r"""
import os, re
os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
import jax, numpy as np, torch
import torch.nn.functional as F
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
import diffusers_tpu
from diffusers_tpu.interop import backend
from diffusers_tpu.interop.compat import torchax_mesh
vae_mesh = Mesh(np.array(jax.devices()).reshape(1, 8), ("batch", "spatial"))
def mid_block(x, side):  # a VAE's attention over every pixel of a frame: [B, C, H, W] -> one head of H*W tokens
    def attend(a):
        t = backend.wrap(a).permute(0, 2, 3, 1).reshape(a.shape[0], 1, side * side, a.shape[1])
        return F.scaled_dot_product_attention(t, t * 0.5, t * 2.0).jax()
    with backend.jax_mode(), torchax_mesh.mesh_of_traces(vae_mesh):
        split = jax.device_put(x.numpy(), NamedSharding(vae_mesh, P(None, None, None, "spatial")))
        program = jax.jit(attend).lower(split).compile()
        return np.asarray(program(split)), program.as_text()
for side in (48, 8):  # 2,304 queries (split) and 64 (whole)
    x = torch.randn(2, 24, side, side, generator=torch.Generator().manual_seed(side))
    t = x.permute(0, 2, 3, 1).reshape(2, 1, side * side, 24)
    got, text = mid_block(x, side)
    logits = sorted({",".join(m.split(",")[-2:]) for m in re.findall(r"f32\[([\d,]+)\]\S* dot\(", text)})
    print("SIDE", side, "ERR", float(np.abs(got - F.scaled_dot_product_attention(t, t * 0.5, t * 2.0).numpy()).max()),
          "DOTS", ";".join(logits))
"""


def test_a_vae_attention_on_a_mesh_runs_its_query_rows_split_over_the_devices():
    """Left to XLA's partitioner, a VAE mid-block's exact attention on a mesh gathered the video and every device
    computed every row; now each of the 8 devices computes 1/8 of the rows against all keys (its program's logits
    product is [rows / 8, rows]), equal to torch's SDPA. A small attention (a text encoder's) stays whole."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _VAE_MID_BLOCK_ON_A_MESH], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    found = {int(line.split()[1]): line.split() for line in done.stdout.splitlines() if line.startswith("SIDE")}
    for side, rows in ((48, 2304), (8, 64)):
        error, dots = float(found[side][3]), found[side][5].split(";")
        assert error < 3e-6, (side, error)
        logits = [d for d in dots if d.endswith(f",{rows}")]
        per_device = rows // 8 if side == 48 else rows
        assert logits == [f"{per_device},{rows}"], (side, dots)
