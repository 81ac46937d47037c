"""AnimateDiff's FreeNoise on JAX: stock's video. It shuffles the noise of later frame windows with
``torch.randperm(n, generator=...)`` (no device): torchax drew that from its own key, another order than stock's (the
video differed by 0.85 and FreeNoise was refused); such draws now come from torch's generator on the host
(``interop/host_scalars.draw``)."""

import numpy as np
import pytest
import torch

from diffusers_tpu.interop import backend
from diffusers_tpu.testing import tiny_unet


def test_a_draw_without_a_device_follows_the_generator_inside_a_call():
    expected = torch.randperm(8, generator=torch.Generator().manual_seed(3))
    with backend.jax_mode():
        drawn = torch.randperm(8, generator=torch.Generator().manual_seed(3))
        assert backend.is_jax_tensor(drawn)  # a device tensor, as torchax makes it
        assert np.asarray(drawn.jax()).tolist() == expected.tolist()


@pytest.mark.slow
def test_free_noise_on_jax_is_stock_enabled_before_or_after_the_move():
    pipe, call = tiny_unet.pipeline("animatediff")
    call = dict(call, output_type="np", prompt="a cat walks", num_frames=16)  # two shuffled windows past the first
    call.pop("negative_prompt", None)
    pipe.enable_free_noise(context_length=8, context_stride=4)
    expected = pipe(**call, generator=torch.Generator().manual_seed(0)).frames
    pipe.to("jax")
    np.testing.assert_allclose(pipe(**call, generator=torch.Generator().manual_seed(0)).frames, expected, atol=1e-4)
    pipe.disable_free_noise()
    plain = pipe(**call, generator=torch.Generator().manual_seed(0)).frames
    assert np.abs(plain - expected).max() > 1e-2  # FreeNoise changes the video: the check above could fail
    pipe.enable_free_noise(context_length=8, context_stride=4)  # after the move: run on the host, moved again
    np.testing.assert_allclose(pipe(**call, generator=torch.Generator().manual_seed(0)).frames, expected, atol=1e-4)
    pipe.to("cpu")
