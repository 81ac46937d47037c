"""``fuse_qkv_projections()`` on a pipeline already on JAX (diffusers' ``test_fused_qkv_projections``): the fusing
runs on host copies of the weights, the fused layers go to the devices on the next call, and the output stays
stock's — fused, unfused, and back on torch."""

import numpy as np
import torch

from diffusers_tpu.interop import backend
from diffusers_tpu.testing import tiny, tiny_unet
from tests.conftest import assert_np_matches, generate


def test_stable_diffusion_fuses_after_the_move():
    pipe, call = tiny_unet.pipeline("sd")
    pipe.safety_checker = None
    call = dict(call, output_type="np")
    run = lambda: pipe(**call, generator=torch.Generator().manual_seed(0)).images  # noqa: E731
    reference = run()
    pipe.to("jax")
    pipe.fuse_qkv_projections()
    attention = pipe.unet.mid_block.attentions[0].transformer_blocks[0].attn1
    assert type(attention.processor).__name__ == "FusedAttnProcessor2_0"
    assert not backend.is_jax_tensor(attention.to_qkv.weight)  # built on the host copies
    assert backend.is_jax_tensor(attention.to_q.weight)  # the originals are back on the devices
    assert_np_matches(run(), reference)
    assert backend.is_jax_tensor(attention.to_qkv.weight)  # placed by the call
    pipe.to("cpu")  # still fused: the fused layer comes back to the host with everything else
    assert attention.to_qkv.weight.device.type == "cpu" and not backend.is_jax_tensor(attention.to_qkv.weight)
    np.testing.assert_allclose(run(), reference, atol=1e-5)
    pipe.to("jax")
    pipe.unfuse_qkv_projections()
    assert type(attention.processor).__name__ != "FusedAttnProcessor2_0"
    assert_np_matches(run(), reference)
    pipe.to("cpu")


def test_wan_transformer_fuses_after_the_move():
    pipe = tiny.wan_pipeline("wan-4head")
    reference = generate(pipe, output_type="np")
    pipe.to("jax")
    pipe.transformer.fuse_qkv_projections()
    assert backend.is_jax_tensor(pipe.transformer.blocks[0].attn1.to_q.weight)
    assert hasattr(pipe.transformer.blocks[0].attn1, "to_qkv")
    assert_np_matches(generate(pipe, output_type="np"), reference)
    pipe.to("cpu")


def test_a_controlnet_built_from_a_moved_unet_has_its_weights():
    """``ControlNetModel.from_unet(pipe.unet)`` after the move (and ``UNetMotionModel.from_unet2d``, AnimateDiff's
    ``from_pipe``) loads the UNet's weights into new host modules: it reads host copies of them, and the UNet stays
    on JAX."""
    import diffusers

    pipe, _ = tiny_unet.pipeline("sd")
    host = {k: v.clone() for k, v in pipe.unet.state_dict().items()}
    pipe.to("jax")
    controlnet = diffusers.ControlNetModel.from_unet(pipe.unet)
    assert torch.equal(controlnet.conv_in.weight, host["conv_in.weight"])
    assert torch.equal(controlnet.down_blocks[0].resnets[0].conv1.weight, host["down_blocks.0.resnets.0.conv1.weight"])
    assert backend.is_jax_tensor(pipe.unet.conv_in.weight)
    pipe.to("cpu")
