"""A component set anew after the move (``pipe.transformer = ...``, diffusers' ``test_..._height_width_opt`` does it
with a UNet) is placed at the next call: the pipeline moves again, said in a warning, and gives stock's output with
the new component; before, the new module ran as host torch code inside the call (correct, op by op)."""

import logging

import torch
from diffusers import WanTransformer3DModel

from diffusers_tpu.interop import backend
from diffusers_tpu.testing import tiny
from tests.conftest import assert_np_matches, generate


def test_a_replaced_transformer_is_placed_at_the_next_call(caplog):
    pipe = tiny.wan_pipeline("wan-4head")
    torch.manual_seed(7)
    config = dict(tiny.WAN_TRANSFORMERS["wan-4head"])
    replacement = WanTransformer3DModel(**config).eval()
    pipe.to("jax")
    generate(pipe, output_type="np")
    original = pipe.transformer
    pipe.transformer = replacement.to("jax")  # outside a call: stays on the host until the pipeline takes it
    with caplog.at_level(logging.WARNING, logger="diffusers_tpu"):
        got = generate(pipe, output_type="np")
    assert "pipe.transformer replaced since pipe.to('jax'): moving the pipeline again" in caplog.text
    assert all(backend.is_jax_tensor(p) for p in pipe.transformer.parameters())
    assert all(type(p) is torch.nn.Parameter for p in original.parameters())  # the old one restored on the host
    pipe.to("cpu")
    assert_np_matches(got, generate(pipe, output_type="np"))  # stock, with the new transformer
    caplog.clear()
    pipe.to("jax")
    with caplog.at_level(logging.WARNING, logger="diffusers_tpu"):
        generate(pipe, output_type="np")
    assert "replaced since" not in caplog.text  # nothing replaced: no second move
    pipe.to("cpu")
