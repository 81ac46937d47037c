"""TPUConfig(text_encoder="auto"), the default: where text encoders run, decided from the weights as placed."""

import pytest
import torch
from torchax.tensor import Tensor

import diffusers_tpu
from diffusers_tpu.interop import sharding
from diffusers_tpu.runtime import text_encoder_placement
from diffusers_tpu.runtime.attach import pipeline_runtime
from diffusers_tpu.testing import tiny
from tests.conftest import assert_np_matches, generate


def _weight_bytes(*modules) -> int:
    """Every tensor once, in its own dtype (no dtype cast configured): what one device holds unsharded."""
    seen, total = set(), 0
    for module in modules:
        for tensor in [*module.parameters(), *module.buffers()]:
            if id(tensor) not in seen:
                seen.add(id(tensor))
                itemsize = 4 if tensor.dtype == torch.int64 else tensor.element_size()  # int64 is placed as int32
                total += tensor.numel() * itemsize
    return total


@pytest.fixture(scope="module")
def pipe():
    return tiny.wan_pipeline("wan")


@pytest.fixture(scope="module")
def reference(pipe):
    return generate(pipe, output_type="np")


def test_the_default_is_auto_and_keeps_encoders_on_the_host_with_cpu_devices(pipe, reference):
    assert diffusers_tpu.TPUConfig().text_encoder == "auto"
    pipe.to("jax")
    try:
        assert pipeline_runtime.runtime_of(pipe).text_encoder_placement == "host"
        assert not isinstance(pipe.text_encoder.shared.weight, Tensor)
        assert_np_matches(generate(pipe, output_type="np"), reference)
    finally:
        pipe.to("cpu")


@pytest.mark.parametrize("room", ["fits", "too_small"])
def test_auto_places_encoders_on_accelerators_by_their_weights(pipe, reference, monkeypatch, room):
    """An accelerator's memory limit (patched in: CPU devices report none) decides, at the rule's boundary."""
    total = _weight_bytes(pipe.transformer, pipe.vae, pipe.text_encoder)
    boundary = int(total / text_encoder_placement.WEIGHT_SHARE)
    limit = boundary + 1 if room == "fits" else boundary - int(1 / text_encoder_placement.WEIGHT_SHARE) - 1
    monkeypatch.setattr(text_encoder_placement, "device_memory_limit", lambda devices: limit)
    pipe.to("jax")
    try:
        on_devices = room == "fits"
        assert pipeline_runtime.runtime_of(pipe).text_encoder_placement == ("jax" if on_devices else "host")
        assert isinstance(pipe.text_encoder.shared.weight, Tensor) is on_devices
        assert_np_matches(generate(pipe, output_type="np"), reference)
    finally:
        pipe.to("cpu")
    assert all(type(p) is torch.nn.Parameter for p in pipe.text_encoder.parameters())


def test_explicit_placements_override_the_rule(pipe, monkeypatch):
    monkeypatch.setattr(text_encoder_placement, "device_memory_limit", lambda devices: 1 << 50)
    pipe.to("jax", config=diffusers_tpu.TPUConfig(text_encoder="host"))
    try:
        assert pipeline_runtime.runtime_of(pipe).text_encoder_placement == "host"
        assert not isinstance(pipe.text_encoder.shared.weight, Tensor)
    finally:
        pipe.to("cpu")


def test_per_device_bytes_follow_the_sharding_and_the_weight_format(pipe):
    from diffusers_tpu.runtime.registry import family_of
    from diffusers_tpu.runtime.weights import quantize

    transformer = pipe.transformer
    whole = _weight_bytes(transformer)
    one = text_encoder_placement.per_device_bytes(sharding.plan(transformer, {"dp": 1, "sp": 1, "tp": 1}), {"tp": 1})
    assert one == whole
    mesh = {"dp": 1, "sp": 1, "tp": 2}
    rules = family_of(pipe).rules(transformer, mesh)
    split = text_encoder_placement.per_device_bytes(sharding.plan(transformer, mesh, rules), mesh)
    assert whole / 2 <= split < whole  # the linear weights halve, norms and biases of replicated parts do not
    names = frozenset(quantize.targets(transformer))
    int8 = text_encoder_placement.per_device_bytes(sharding.plan(transformer, mesh, rules), mesh, names)
    assert int8 < split
    assert text_encoder_placement.choose(10, None) == "host"
    assert text_encoder_placement.choose(40, 100) == "jax" and text_encoder_placement.choose(41, 100) == "host"


def test_bad_placement_names_the_choices():
    with pytest.raises(ValueError, match=r"'auto', 'host', 'jax'"):
        diffusers_tpu.TPUConfig(text_encoder="device")


def test_auto_keeps_an_encoder_with_a_hook_jax_refuses_on_the_host(monkeypatch):
    """A hook JAX cannot run on a text encoder: "jax" refuses with the reason, "auto" runs the encoder on the host."""
    from diffusers.hooks import HookRegistry, ModelHook

    pipe = tiny.wan_pipeline("wan")
    # registered under the name enable_layerwise_casting gives its hook (a no-op here, so the host run is stock's)
    HookRegistry.check_if_exists_or_initialize(pipe.text_encoder).register_hook(ModelHook(), "layerwise_casting")
    monkeypatch.setattr(text_encoder_placement, "device_memory_limit", lambda devices: 1 << 50)
    with pytest.raises(ValueError, match="enable_layerwise_casting"):
        pipe.to("jax", config=diffusers_tpu.TPUConfig(text_encoder="jax"))
    pipe.to("jax")
    try:
        assert pipeline_runtime.runtime_of(pipe).text_encoder_placement == "host"
        assert generate(pipe, output_type="np").shape[0] == 2
    finally:
        pipe.to("cpu")
