"""Features a GPU script turns on that JAX refuses with the project's error, naming what works, before anything
runs: ``enable_group_offload`` onto the JAX device (it streams blocks from the host around each forward; a step on
JAX is one compiled program; outside a call the 'jax' device is the host, so stock's hooks would run everything on
torch CPU, silently), and AnimateDiff's FreeNoise (its video differed from stock's)."""

import numpy as np
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


def test_free_noise_is_refused_on_jax_and_the_fix_runs_as_stock():
    """AnimateDiff's FreeNoise on a moved pipeline is refused before anything runs (its video differed from stock's);
    doing what the error says, ``disable_free_noise()`` — which rebuilds the motion blocks from their weights, on
    the host — runs on JAX with stock's video."""
    from diffusers_tpu.testing import tiny_unet

    pipe, call = tiny_unet.pipeline("animatediff")
    call = dict(call, output_type="np")
    expected = pipe(**call, generator=torch.Generator().manual_seed(0)).frames
    pipe.enable_free_noise(context_length=8, context_stride=4)
    pipe.to("jax")
    with pytest.raises(
        ValueError, match=r"FreeNoise \(enable_free_noise\) is not supported on JAX yet.*disable_free_noise"
    ):
        pipe(**call, generator=torch.Generator().manual_seed(0))
    pipe.disable_free_noise()
    got = pipe(**call, generator=torch.Generator().manual_seed(0)).frames
    np.testing.assert_allclose(got, expected, atol=1e-4)
    pipe.to("cpu")
