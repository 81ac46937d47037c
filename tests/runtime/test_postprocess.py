"""On-device postprocess = stock VideoProcessor.postprocess_video, bit for bit where floats agree."""

import numpy as np
import pytest
import torch
from diffusers.video_processor import VideoProcessor

from diffusers_tpu.interop import backend
from diffusers_tpu.interop.backend import host_to_jax, wrap
from diffusers_tpu.runtime.call import postprocess


def video(dtype=torch.float32, channels=3):
    values = torch.rand(2, channels, 4, 8, 6, generator=torch.Generator().manual_seed(0)) * 2.4 - 1.2
    # exact .5 rounding boundaries after denormalize * 255: stock rounds half to even
    values[0, 0, 0, 0, :4] = torch.tensor([2 * (k + 0.5) / 255 - 1 for k in (0, 1, 100, 253)])
    return values.to(dtype)


@pytest.mark.parametrize("output_type", ["np", "pil", "pt"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("channels", [3, 1])
def test_matches_stock(output_type, dtype, channels):
    processor = VideoProcessor(vae_scale_factor=8)
    x = video(dtype, channels)
    expected = processor.postprocess_video(x, output_type=output_type)
    with backend.jax_mode():
        got = postprocess.postprocess_video(processor, processor.postprocess_video, wrap(host_to_jax(x)), output_type)
    if output_type == "np":
        assert got.dtype == np.float32 and got.shape == expected.shape
        np.testing.assert_array_equal(got, expected)
    elif output_type == "pt":
        got = backend.jax_to_host(got.jax())
        assert got.dtype == expected.dtype
        torch.testing.assert_close(got, expected, atol=0, rtol=0)
    else:
        assert [[f.mode for f in v] for v in got] == [[f.mode for f in v] for v in expected]
        np.testing.assert_array_equal(
            np.stack([np.stack([np.asarray(f) for f in v]) for v in got]),
            np.stack([np.stack([np.asarray(f) for f in v]) for v in expected]),
        )


def test_uint8_crosses_to_the_host():
    frames = postprocess.frames_uint8(wrap(host_to_jax(video())))
    assert frames.dtype == np.uint8 and frames.shape == (2, 4, 8, 6, 3)


def test_unusual_requests_go_to_stock():
    processor = VideoProcessor(vae_scale_factor=8)
    calls = []
    stock = lambda v, output_type, **kw: calls.append((output_type, kw)) or "stock"  # noqa: E731
    assert postprocess.postprocess_video(processor, stock, video(), "np") == "stock"  # a CPU tensor
    with backend.jax_mode():
        x = wrap(host_to_jax(video()))
        assert postprocess.postprocess_video(processor, stock, x, "latent") == "stock"
        assert postprocess.postprocess_video(processor, stock, x, "np", do_denormalize=[False]) == "stock"
    assert len(calls) == 3


@pytest.mark.parametrize("kind", ["video", "image"])
def test_stock_pil_is_stocks_own_pil_output(kind):
    """The tests' stock "pil" reference (conftest.stock_pil of stock's "np" output) is exactly stock's "pil" call."""
    from diffusers_tpu.testing import tiny, tiny_images
    from tests.conftest import generate, pil_array, stock_pil

    if kind == "video":
        pipe = tiny.wan_pipeline("wan-4head")
        outputs = {t: generate(pipe, output_type=t, num_inference_steps=2) for t in ("np", "pil")}
    else:
        pipe, call = tiny_images.pipeline("flux")
        outputs = {
            t: pipe(**call, output_type=t, generator=torch.Generator().manual_seed(0)).images for t in ("np", "pil")
        }
    derived = stock_pil(outputs["np"])
    assert type(derived) is type(outputs["pil"]) and len(derived) == len(outputs["pil"])
    np.testing.assert_array_equal(pil_array(derived), pil_array(outputs["pil"]))
