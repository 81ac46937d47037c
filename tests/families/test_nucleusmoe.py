"""NucleusMoE-Image's experts on JAX: stock's per-expert loop as one grouped matmul (``families/nucleusmoe.py``), for
any group sizes, padding rows zero; and compiled by the TPU compiler in bfloat16 (its grouped-matmul kernel refuses
the "highest" precision the runtime configures for float32)."""

import diffusers
import jax
import numpy as np
import pytest
import torch

from diffusers_tpu.interop import backend
from diffusers_tpu.planner import tpu_compiler

pytestmark = pytest.mark.skipif(not hasattr(diffusers, "NucleusMoEImagePipeline"), reason="new in diffusers 0.42")


def experts(count=4, width=16, hidden=24):
    from diffusers.models.transformers.transformer_nucleusmoe_image import SwiGLUExperts

    module = SwiGLUExperts(hidden_size=width, moe_intermediate_dim=hidden, num_experts=count)
    generator = torch.Generator().manual_seed(0)
    for weight in (module.gate_up_proj, module.down_proj):
        weight.data = torch.randn(weight.shape, generator=generator) / weight.shape[1] ** 0.5
    return module


@pytest.mark.parametrize("counts", [[5, 5, 5, 5], [0, 7, 2, 9], [3, 0, 0, 1]])  # uneven, empty groups, padding rows
def test_grouped_matmul_is_stocks_loop(counts):
    from diffusers_tpu.families import nucleusmoe

    module = experts()
    x = torch.randn(20, 16, generator=torch.Generator().manual_seed(1))
    sizes = torch.tensor(counts)
    with torch.no_grad():
        expected = module._run_experts_for_loop(x, sizes)  # stock: rows past the groups zero
    got = backend.jax_to_host(nucleusmoe.grouped_swiglu(module, x, sizes).jax()).numpy()
    np.testing.assert_allclose(got, expected.numpy(), atol=1e-5)
    assert not got[sum(counts) :].any() and got[: sum(counts)].any()


@pytest.mark.skipif(not tpu_compiler.available(), reason="libtpu (the TPU compiler) not installed")
def test_grouped_matmul_compiles_for_tpu_in_bfloat16():
    from diffusers_tpu.families import nucleusmoe

    (device,) = tpu_compiler.devices("v6e-1")
    where = jax.sharding.SingleDeviceSharding(device)
    shapes = {"rows": (512, 256), "sizes": (8,), "gate_up": (8, 256, 256), "down": (8, 128, 256)}
    dtypes = {"rows": "bfloat16", "sizes": "int32", "gate_up": "bfloat16", "down": "bfloat16"}
    abstract = [jax.ShapeDtypeStruct(shapes[n], dtypes[n], sharding=where) for n in shapes]
    with jax.default_matmul_precision("highest"):  # the runtime's default for float32 pipelines
        compiled = jax.jit(nucleusmoe.swiglu_experts).lower(*abstract).compile()
    assert compiled.as_text()  # compiled (Mosaic refused bfloat16 operands at "highest": "Bad lhs type")
