"""Video postprocessing on the device, with exactly stock ``VideoProcessor.postprocess_video`` semantics.

Stock: per video, ``denormalize`` (``x * 0.5 + 0.5`` clamped to [0, 1], in the video's dtype, when the
processor's ``do_normalize`` is set), then "pt" returns that, "np" casts to float32 and lays frames out as
``F x H x W x C``, and "pil" rounds ``np * 255`` half-to-even to uint8. The same ops run here on the device, so
"pil" moves uint8 frames (a quarter of the float32 bytes) to the host and equals stock wherever the float
frames agree.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import PIL.Image
from diffusers.image_processor import VaeImageProcessor

from ...interop import processes
from ...interop.backend import is_jax_tensor, to_jax_array, wrap


@functools.partial(jax.jit, static_argnames=("denormalize",))
def _pt(video, denormalize: bool):  # [B, C, F, H, W] -> [B, F, C, H, W], video dtype
    if denormalize:
        video = jnp.clip(video * 0.5 + 0.5, 0, 1)
    return jnp.transpose(video, (0, 2, 1, 3, 4))


@functools.partial(jax.jit, static_argnames=("denormalize",))
def _np(video, denormalize: bool):  # -> [B, F, H, W, C] float32
    return jnp.transpose(_pt(video, denormalize), (0, 1, 3, 4, 2)).astype(jnp.float32)


@functools.partial(jax.jit, static_argnames=("denormalize",))
def video_uint8(video, denormalize: bool):  # -> [B, F, H, W, C] uint8, rounded like numpy_to_pil
    return jnp.round(_np(video, denormalize) * 255).astype(jnp.uint8)


def _pil(frames: np.ndarray) -> list[PIL.Image.Image]:
    if frames.shape[-1] == 1:
        return [PIL.Image.fromarray(frame.squeeze(), mode="L") for frame in frames]
    return [PIL.Image.fromarray(frame) for frame in frames]


def frames_uint8(video) -> np.ndarray:
    """Quantize a decoded ``[B, C, F, H, W]`` video in [-1, 1] to uint8 ``[B, F, H, W, C]`` on the device."""
    return processes.fetch(video_uint8(to_jax_array(video), True))


def postprocess_video(processor, stock, video, output_type: str = "np", **kwargs):
    """``processor.postprocess_video`` for videos on the device; anything unusual goes to ``stock``."""
    if kwargs or not is_jax_tensor(video) or output_type not in ("np", "pil", "pt") or video.ndim != 5:
        return stock(video, output_type, **kwargs)
    array = to_jax_array(video)
    denormalize = bool(processor.config.do_normalize)
    if output_type == "pt":
        return wrap(_pt(array, denormalize))
    if output_type == "np":
        return processes.fetch(_np(array, denormalize))
    return [_pil(frames) for frames in processes.fetch(video_uint8(array, denormalize))]


@functools.partial(jax.jit, static_argnames=("denormalize",))
def _image_np(image, denormalize: bool):  # [B, C, H, W] -> [B, H, W, C] float32, as VaeImageProcessor.pt_to_numpy
    if denormalize:
        image = jnp.clip(image * 0.5 + 0.5, 0, 1)
    return jnp.transpose(image, (0, 2, 3, 1)).astype(jnp.float32)


@functools.partial(jax.jit, static_argnames=("denormalize",))
def _image_uint8(image, denormalize: bool):
    return jnp.round(_image_np(image, denormalize) * 255).astype(jnp.uint8)


def postprocess_image(processor, stock, image, output_type: str = "pil", do_denormalize=None):
    """``VaeImageProcessor.postprocess`` for images on the device; anything unusual goes to ``stock``."""
    # Stable Diffusion passes one flag per image (False where its safety checker blacked one out): all alike is
    # one program; a mixed list goes to stock.
    flags = None if do_denormalize is None else set(map(bool, do_denormalize))
    if (
        flags is not None
        and len(flags) != 1
        or not is_jax_tensor(image)
        or output_type not in ("np", "pil")
        or image.ndim != 4
    ):
        return stock(image, output_type, do_denormalize)
    array = to_jax_array(image)
    denormalize = bool(processor.config.do_normalize) if flags is None else flags.pop()
    if output_type == "np":
        return processes.fetch(_image_np(array, denormalize))
    return _pil(processes.fetch(_image_uint8(array, denormalize)))


def install(processor) -> None:
    stock = processor.postprocess_video
    processor.postprocess_video = functools.partial(postprocess_video, processor, stock)
    processor.postprocess_video.__wrapped__ = stock


def install_image(processor) -> bool:
    """On-device postprocessing for a stock ``VaeImageProcessor`` (image pipelines); False if not one."""
    if not isinstance(processor, VaeImageProcessor) or type(processor).postprocess is not VaeImageProcessor.postprocess:
        return False
    stock = processor.postprocess
    processor.postprocess = functools.partial(postprocess_image, processor, stock)
    processor.postprocess.__wrapped__ = stock
    return True


def uninstall(processor, name: str = "postprocess_video") -> None:
    current = vars(processor).get(name)
    if current is not None and hasattr(current, "__wrapped__"):
        del vars(processor)[name]
