"""TPUConfig(quantize=...): the denoiser's linear weights stored as int8 (or fp8) on the devices, rebuilt inside
the compiled matmuls. Lossy by design: these tests pin where the loss is (weights only, within half a step of
their per-channel scale) and how large it is end to end against the unquantized pipeline."""

import jax.numpy as jnp
import numpy as np
import pytest
import torch

import diffusers_tpu
from diffusers_tpu import TPUConfig
from diffusers_tpu.interop import compile_accounting, sharding
from diffusers_tpu.runtime.weights import quantize
from diffusers_tpu.testing import tiny
from tests.conftest import generate

VARIANT = "wan-4head"


def linear_weights(transformer) -> dict:
    return {
        f"{name}.weight": module.weight
        for name, module in transformer.named_modules()
        if isinstance(module, torch.nn.Linear)
    }


@pytest.fixture(scope="module")
def reference():
    """Stock torch float32, and the unquantized JAX pipeline in bfloat16 (what int8 is compared with)."""
    ref = generate(tiny.wan_pipeline(VARIANT), output_type="np")
    pipe = tiny.wan_pipeline(VARIANT).to("jax", config=TPUConfig(dtype=torch.bfloat16))
    bf16 = generate(pipe, output_type="np")
    specs = {name: diffusers_tpu.sharding_of(w).spec for name, w in linear_weights(pipe.transformer).items()}
    pipe.to("cpu")
    restored = {name: w.detach().clone() for name, w in pipe.transformer.state_dict().items()}
    return ref, bf16, specs, restored


def test_linear_weights_are_int8_sharded_within_half_a_step_and_restored(reference):
    _, _, specs, restored = reference
    pipe = tiny.wan_pipeline(VARIANT)
    host = {name: w.detach().to(torch.bfloat16).float() for name, w in linear_weights(pipe.transformer).items()}
    pipe.to("jax", config=TPUConfig(dtype=torch.bfloat16, quantize="int8"))
    weights = linear_weights(pipe.transformer)
    assert weights.keys() == specs.keys()
    kept = {name for name in weights if "time_embedder" in name}  # Wan's _keep_in_fp32_modules
    assert kept and all(weights.pop(name).dtype == torch.float32 for name in kept)
    assert len(weights) > 8
    slots = {s.qualified: s for s in sharding.slots_of(pipe.transformer)}
    for name, weight in weights.items():
        assert weight.dtype == torch.int8, name
        spec = diffusers_tpu.sharding_of(weight).spec
        assert spec == specs[name], (name, spec)  # sharded exactly like the weight it replaces
        scale = slots[name].scale
        assert scale.shape == (weight.shape[0],) and tuple(scale.sharding.spec) == (spec[0] if len(spec) else None,)
        values = np.asarray(weight.jax(), np.float32)
        error = np.abs(values * np.asarray(scale)[:, None] - host[name].numpy())
        assert (error <= np.asarray(scale)[:, None] * 0.5 + 1e-6).all(), name  # round to nearest: half a step
        assert np.abs(values).max() == 127  # the per-channel scale uses the full range
    assert pipe.transformer.patch_embedding.weight.dtype == torch.bfloat16  # not a linear layer: as placed
    on_jax = pipe.transformer.state_dict()  # what save_pretrained writes: the weights, never int8 values
    assert on_jax.keys() == restored.keys() and all(torch.equal(v, restored[k]) for k, v in on_jax.items())
    pipe.to("cpu")
    for name, value in pipe.transformer.state_dict().items():  # as the unquantized placement restores them
        assert torch.equal(value, restored[name]), name


def test_int8_pipeline_close_to_unquantized_and_compiles_once(reference):
    ref, bf16, _, _ = reference
    pipe = tiny.wan_pipeline(VARIANT).to("jax", config=TPUConfig(quantize="int8"))  # float32 compute
    out = generate(pipe, output_type="np")
    with compile_accounting.compile_log() as log:
        again = generate(pipe, output_type="np")
    assert log.compilations == 0
    np.testing.assert_array_equal(out, again)
    assert np.isfinite(out).all()
    # Measured (this tiny model, 3 steps): int8 weights with float32 compute are 3.4e-4 max / 1e-5 mean from stock
    # float32; the unquantized bfloat16 pipeline is 0.24 max / 2.2e-3 mean. int8 must stay well inside bf16's error.
    int8_error, bf16_error = np.abs(out - ref), np.abs(bf16 - ref)
    assert int8_error.mean() < 0.1 * bf16_error.mean(), (int8_error.mean(), bf16_error.mean())
    assert int8_error.max() < 1e-2
    pipe.to("cpu")
    np.testing.assert_array_equal(generate(pipe, output_type="np"), ref)  # float32 host weights back exactly


def test_fp8_storage():
    pipe = tiny.wan_pipeline(VARIANT).to("jax", config=TPUConfig(dtype=torch.bfloat16, quantize="fp8"))
    weight = pipe.transformer.blocks[0].attn1.to_q.weight
    assert weight.jax().dtype == jnp.float8_e4m3fn
    assert np.isfinite(generate(pipe, output_type="np")).all()


def test_quantize_errors_leave_the_pipeline_usable():
    with pytest.raises(ValueError, match="quantize='int4'.*int8"):
        TPUConfig(quantize="int4")
    pipe = tiny.wan_pipeline("wan")
    pipe.load_lora_weights({f"transformer.{k}": v for k, v in _adapter(pipe).items()}, adapter_name="a")
    pipe.to("jax", config=TPUConfig(quantize="int8"))
    with pytest.raises(ValueError, match="quantized"):
        pipe.fuse_lora(lora_scale=0.5)
    assert np.isfinite(generate(pipe, output_type="np", num_inference_steps=2)).all()  # adapters run unmerged
    assert pipe.transformer.blocks[0].attn1.to_q.base_layer.weight.dtype == torch.int8
    assert pipe.transformer.blocks[0].attn1.to_q.lora_A["a"].weight.dtype == torch.float32  # adapters not quantized


def _adapter(pipe, rank=2):
    generator, state = torch.Generator().manual_seed(0), {}
    for name, module in pipe.transformer.named_modules():
        if name.endswith("attn1.to_q"):
            state[f"{name}.lora_A.weight"] = torch.randn(rank, module.in_features, generator=generator) * 0.3
            state[f"{name}.lora_B.weight"] = torch.randn(module.out_features, rank, generator=generator) * 0.3
    return state


def test_quantizer_rounds_per_output_channel():
    weight = jnp.asarray([[0.5, -1.0, 0.25], [0.0, 0.0, 0.0], [2.0, 1.0, -0.01]], jnp.float32)
    values, scale = quantize.quantize_array(weight, "int8")
    np.testing.assert_allclose(np.asarray(scale), [1.0 / 127, 1.0, 2.0 / 127])
    np.testing.assert_array_equal(np.asarray(values), [[64, -127, 32], [0, 0, 0], [127, 64, -1]])
