"""``enable_group_offload`` onto the JAX device is refused before any hook is installed, naming what works (group
offloading streams blocks from the host around each forward; a step on JAX is one compiled program). Outside a call
the 'jax' device is the host, so without the refusal stock's hooks would run everything on torch CPU, silently."""

import pytest
import torch
from diffusers.hooks import HookRegistry

from diffusers_tpu.testing import tiny
from tests.conftest import generate


def _hooked(module) -> bool:
    registries = [getattr(m, "_diffusers_hook", None) for m in module.modules()]
    return any(r is not None and r.get_hook("group_offloading") is not None for r in registries)


@pytest.mark.parametrize("device", ["jax", "tpu", torch.device("jax")])
def test_group_offload_onto_jax_is_refused_and_the_pipeline_still_runs(device):
    pipe = tiny.wan_pipeline("wan")
    reference = generate(pipe, output_type="np")
    with pytest.raises(ValueError, match=r"not implemented on JAX: .* pipe\.to\('tpu'\)"):
        pipe.transformer.enable_group_offload(device, offload_type="block_level", num_blocks_per_group=1)
    with pytest.raises(ValueError, match=r"enable_model_cpu_offload\(device='tpu'\)"):
        pipe.enable_group_offload(onload_device=device, offload_type="leaf_level")
    assert not _hooked(pipe.transformer) and not _hooked(pipe.vae)
    assert (generate(pipe, output_type="np") == reference).all()


def test_group_offload_onto_the_cpu_is_stock():
    pipe = tiny.wan_pipeline("wan")
    pipe.transformer.enable_group_offload("cpu", offload_type="block_level", num_blocks_per_group=1)
    assert HookRegistry.check_if_exists_or_initialize(pipe.transformer).get_hook("group_offloading") is not None
