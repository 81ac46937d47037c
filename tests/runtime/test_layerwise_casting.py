"""``enable_layerwise_casting`` on a denoiser that is on JAX (``runtime.layerwise_casting``): the layers stock picks
stored in the storage dtype on the devices, cast to the compute dtype inside the programs; the same video as stock's
layerwise casting (float32 compute, so the comparison is exact to 1e-4), and stock's state back on torch."""

import numpy as np
import pytest
import torch

from diffusers_tpu.interop import compile_accounting
from diffusers_tpu.testing import tiny
from tests.conftest import generate

CASTING = dict(storage_dtype=torch.float8_e4m3fn, compute_dtype=torch.float32)


def run(pipe):
    return generate(pipe, output_type="np", num_inference_steps=2)


def narrow(module):
    return sorted(name for name, p in module.named_parameters() if p.dtype == torch.float8_e4m3fn)


def test_layerwise_casting_on_jax_matches_stocks():
    stock = tiny.wan_pipeline()
    stock.transformer.enable_layerwise_casting(**CASTING)
    reference, stock_narrow = run(stock), narrow(stock.transformer)
    assert stock_narrow and any("norm" in n for n, _ in stock.transformer.named_parameters())

    pipe = tiny.wan_pipeline().to("jax")
    run(pipe)
    pipe.transformer.enable_layerwise_casting(**CASTING)
    assert narrow(pipe.transformer) == stock_narrow  # exactly the layers stock casts, stored narrow on the devices
    np.testing.assert_allclose(run(pipe), reference, atol=1e-4)
    with compile_accounting.compile_log() as log:
        run(pipe)
    assert log.compilations == 0

    pipe.to("cpu")  # stock's state: storage-dtype weights and its hooks
    assert narrow(pipe.transformer) == stock_narrow
    np.testing.assert_array_equal(run(pipe), reference)


def test_only_the_denoiser_casts_on_jax_and_the_pipeline_stays_usable():
    reference = run(tiny.wan_pipeline())
    pipe = tiny.wan_pipeline().to("jax")
    with pytest.raises(ValueError, match="not the pipeline's denoiser"):
        pipe.vae.enable_layerwise_casting(**CASTING)
    np.testing.assert_allclose(run(pipe), reference, atol=1e-4)
