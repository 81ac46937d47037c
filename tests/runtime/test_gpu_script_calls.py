"""``runtime.attach.gpu_script_calls``: GPU-script calls given their meaning on JAX."""

import logging
import types

import torch

from diffusers_tpu.runtime.attach import gpu_script_calls


def test_a_generator_on_a_jax_device_draws_on_the_cpu():
    for device in ("tpu", "jax:0", torch.device("cpu"), "TPU"):
        assert gpu_script_calls.generator_device(device) in ("cpu", torch.device("cpu"))
    assert gpu_script_calls.generator_device("cuda") == "cuda"  # anything else as the script asked


def test_the_offload_device_is_read_as_the_stock_signature_reads_it():
    assert gpu_script_calls.offload_device((), {"device": "tpu"}) == "tpu"
    assert gpu_script_calls.offload_device((None, "jax"), {}) == "jax"
    assert gpu_script_calls.offload_device((0,), {}) is None


def test_attention_slicing_on_jax_is_ignored_with_one_warning(caplog):
    runtime = types.SimpleNamespace(attention=types.SimpleNamespace(implementation="splash_exp2"))
    name = "enable_attention_slicing_unit_test"
    with caplog.at_level(logging.WARNING, logger="diffusers_tpu"):
        assert gpu_script_calls.pipeline_method(None, runtime, name, (), {}) == (True, None)
        assert gpu_script_calls.pipeline_method(None, runtime, name, (), {}) == (True, None)
    warned = [r for r in caplog.records if name in r.getMessage()]
    assert len(warned) == 1 and "splash_exp2" in warned[0].getMessage()
    assert gpu_script_calls.pipeline_method(None, None, name, (), {}) == (False, None)  # not on JAX: stock runs


def test_a_placed_model_names_the_native_backend_once_and_gives_back_the_user_s_choices():
    """Through diffusers' public ``set_attention_backend`` at the move (no per-call switching); the process's active
    backend untouched; a processor's own choice (flex too) back on ``pipe.to("cpu")``."""
    from diffusers.models import attention_dispatch

    from diffusers_tpu.runtime import diffusers_private
    from diffusers_tpu.testing import tiny

    names = attention_dispatch.AttentionBackendName
    pipe = tiny.wan_pipeline("wan")
    processors = [block.attn1.processor for block in pipe.transformer.blocks]
    diffusers_private.name_processor_backend(processors[0], names.FLEX)
    active = diffusers_private.active_attention_backend()
    pipe.to("jax")
    try:
        assert diffusers_private.processor_backend(processors[0]) == names.FLEX  # built around a BlockMask: kept
        assert all(diffusers_private.processor_backend(p) == names.NATIVE for p in processors[1:])
        assert diffusers_private.active_attention_backend() == active
    finally:
        pipe.to("cpu")
    assert diffusers_private.processor_backend(processors[0]) == names.FLEX
    assert all(diffusers_private.processor_backend(p) is None for p in processors[1:])
