"""``runtime.decision``: what ``pipe.to`` does is decided once, as a printable record that ``pipe.to`` carries out and
``plan`` (``cost``, ``ready``) read for described devices."""

import jax
import pytest
import torch

from diffusers_tpu import TPUConfig
from diffusers_tpu.interop import backend, sharding
from diffusers_tpu.planner import plan, tpu_compiler
from diffusers_tpu.runtime import decision
from diffusers_tpu.runtime.attach import pipeline_runtime
from diffusers_tpu.testing import tiny

SIZE = dict(height=32, width=32, num_frames=9, guidance_scale=5.0)


def test_the_record_says_what_pipe_to_does_and_pipe_to_carries_it_out():
    pipe = tiny.wan_pipeline("wan")
    target = backend.Target("jax", "cpu")
    decided = decision.decide(pipe, TPUConfig(), target, jax.devices()[:1])
    text = str(decided)
    assert "mesh {'dp': 1, 'sp': 1, 'tp': 1}" in text and "text encoders on the host" in text
    assert "transformer: denoiser" in text and "vae: vae" in text and "transformer step" in text
    assert [c.name for c in decided.components] == ["vae", "transformer"]  # host text encoders: not placed
    pipe.to("jax")
    try:
        runtime = pipeline_runtime.runtime_of(pipe)
        assert runtime.decision == decided and dict(runtime.mesh.shape) == decided.mesh_shape
        placed = {slot.qualified: slot.dtype for slot in pipe.transformer._diffusers_tpu_placement}
        assert placed == {slot.qualified: slot.dtype for slot in decided.component("transformer").slots}
    finally:
        pipe.to("cpu")


def test_one_decision_changed_moves_pipe_to_and_plan_alike(monkeypatch):
    """The denoiser's dtype on the devices decided otherwise (one function): the weights ``pipe.to`` places and the
    weights ``plan`` compiles the step with change together."""

    def step_argument_bytes():
        report = plan.denoiser_memory(tiny.wan_pipeline("wan"), SIZE, TPUConfig(), jax.devices()[:1], 24)
        return report["argument_bytes"]

    def placed_dtypes():
        pipe = tiny.wan_pipeline("wan").to("jax")
        try:
            return {sharding.tensor_of(slot).dtype for slot in pipe.transformer._diffusers_tpu_placement}
        finally:
            pipe.to("cpu")

    before = (step_argument_bytes(), placed_dtypes())
    stock = decision.component_dtype

    def bfloat16_denoiser(family, config, target, name, default):
        return torch.bfloat16 if name == "transformer" else stock(family, config, target, name, default)

    monkeypatch.setattr(decision, "component_dtype", bfloat16_denoiser)
    after = (step_argument_bytes(), placed_dtypes())
    assert before[1] == {torch.float32} and torch.bfloat16 in after[1]  # pipe.to placed what was decided
    assert after[0] < 0.7 * before[0]  # plan compiled the step with the weights pipe.to placed


@pytest.mark.skipif(not tpu_compiler.available(), reason="libtpu (the TPU compiler) not installed")
def test_the_default_mesh_narrows_tp_to_what_the_denoiser_splits():
    """Z-Image at diffusers' test size on a v5e-8: the default mesh's tp=2 divides the heads, not the MLP width (85);
    the default takes the next mesh (tp=1, sp the rest). A mesh the user names is kept: its refusal names the weight.
    (On the 8-device mesh the video is stock's: ``mesh_worker.py``'s family meshes.)"""
    from diffusers_tpu.testing import tiny_images

    pipe, _ = tiny_images.z_image(0, dim=32, heads=2, axes_dims=(8, 4, 4))
    target, devices = backend.Target("tpu", "tpu"), tpu_compiler.devices("v5e-8")
    assert backend.default_mesh_shape(8, 2) == {"dp": 2, "sp": 2, "tp": 2}
    decided = decision.decide(pipe, TPUConfig(), target, devices, memory_limit=None)
    assert decided.mesh_shape == {"dp": 2, "sp": 4, "tp": 1}
    # plan's candidates are the meshes that split: tp=2 is left out there too
    assert not decision.splits_weights(pipe, {"dp": 2, "sp": 2, "tp": 2}) and decision.splits_weights(
        pipe, decided.mesh_shape
    )
    with pytest.raises(ValueError, match=r"\(85, 32\); its dim 0 \(85\) cannot be split over tp=2"):
        decision.decide(pipe, TPUConfig(mesh={"dp": 2, "sp": 2, "tp": 2}), target, devices, memory_limit=None)
    wan = tiny.wan_pipeline("wan-4head")  # every width divides: tp as large as the heads allow
    assert decision.decide(wan, TPUConfig(), target, devices, memory_limit=None).mesh_shape["tp"] == 4


@pytest.mark.skipif(not tpu_compiler.available(), reason="libtpu (the TPU compiler) not installed")
def test_the_default_mesh_keeps_dp_where_the_pipeline_batches_the_pair_itself():
    """PAB keeps one state for both guidance passes, so Wan's loop calls the denoiser twice a step under it and the
    default mesh has no data axis to pair over; CogVideoX concatenates the pair in its one call, so its mesh keeps
    dp=2 under the same cache (tp=8 instead would leave its elementwise work over unsplit tokens)."""
    from diffusers import PyramidAttentionBroadcastConfig

    target, devices = backend.Target("tpu", "tpu"), tpu_compiler.devices("v5e-8")
    wan, cogvideox = tiny.wan_pipeline("wan-4head"), tiny.cogvideox_pipeline("cogvideox1.5")
    plain = {id(p): decision.decide(p, TPUConfig(), target, devices, memory_limit=None) for p in (wan, cogvideox)}
    assert plain[id(wan)].mesh_shape["dp"] == plain[id(cogvideox)].mesh_shape["dp"] == 2
    for pipe in (wan, cogvideox):
        pipe.transformer.enable_cache(
            PyramidAttentionBroadcastConfig(spatial_attention_block_skip_range=2, current_timestep_callback=lambda: 5)
        )
    assert decision.decide(wan, TPUConfig(), target, devices, memory_limit=None).mesh_shape["dp"] == 1
    cached = decision.decide(cogvideox, TPUConfig(), target, devices, memory_limit=None)
    assert cached.mesh_shape == plain[id(cogvideox)].mesh_shape
