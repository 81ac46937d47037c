"""The parts every tiny pipeline is built from: tiny text encoders (UMT5, T5, CLIP, Gemma-2), image processors,
a tiny ``AutoencoderKL``, test images and masks, and the helpers the builders share (``seeded``, ``rebuilt``,
``fit``)."""

from __future__ import annotations

import inspect

import diffusers
import numpy as np
import PIL.Image
import torch
import transformers
from diffusers import (
    AutoencoderKL,
    PriorTransformer,
)
from transformers import (
    CLIPTextConfig,
    CLIPTextModel,
    CLIPTextModelWithProjection,
    CLIPVisionConfig,
    CLIPVisionModelWithProjection,
    Gemma2Config,
    Gemma2Model,
    T5Config,
    T5EncoderModel,
    UMT5Config,
    UMT5EncoderModel,
)

UMT5 = dict(
    vocab_size=384,
    d_model=32,
    d_kv=8,
    d_ff=64,
    num_layers=2,
    num_heads=4,
    relative_attention_num_buckets=8,
    relative_attention_max_distance=32,
    dropout_rate=0.0,
    feed_forward_proj="gated-gelu",
    is_encoder_decoder=False,
    pad_token_id=0,
    eos_token_id=1,
    decoder_start_token_id=0,
)

PROMPTS = dict(
    prompt=["a cat walks on the grass", "a red fox jumps over a sleeping dog in the snow"],
    negative_prompt=["blurry", "low quality, static, deformed"],
)


def tiny_umt5(seed: int = 0):
    torch.manual_seed(seed)
    return UMT5EncoderModel(UMT5Config(**UMT5)).eval()


def tiny_t5(seed: int = 0):
    torch.manual_seed(seed)
    config = {k: v for k, v in UMT5.items() if k != "is_encoder_decoder"}
    return T5EncoderModel(T5Config(**config)).eval()


def tiny_clip(seed: int, hidden: int = 32, projection: bool = False):
    """A CLIP text encoder for the character tokenizer (pad 0, eos 1): pooled at the eos token; with ``projection``
    the class with a text projection (SDXL's second encoder, unCLIP priors)."""
    torch.manual_seed(seed)
    config = CLIPTextConfig(
        hidden_size=hidden,
        intermediate_size=37,
        num_attention_heads=4,
        num_hidden_layers=2,
        projection_dim=hidden,
        max_position_embeddings=77,
        vocab_size=128,
        bos_token_id=None,
        eos_token_id=1,
        pad_token_id=0,
    )
    return (CLIPTextModelWithProjection if projection else CLIPTextModel)(config).eval()


def tiny_clip_vision(seed: int, hidden: int = 32):
    """A CLIP vision encoder with a projection for 32-px images (8-px patches), 2 layers, 4 heads."""
    torch.manual_seed(seed)
    return CLIPVisionModelWithProjection(
        CLIPVisionConfig(
            hidden_size=hidden,
            intermediate_size=37,
            num_attention_heads=4,
            num_hidden_layers=2,
            projection_dim=hidden,
            image_size=32,
            patch_size=8,
        )
    ).eval()


def tiny_gemma2(seed: int):
    """A Gemma 2 text model, 32 wide, 2 layers (Sana, Sana Video, SANA-WM)."""
    return seeded(
        seed,
        lambda: Gemma2Model(
            Gemma2Config(
                hidden_size=32,
                intermediate_size=32,
                num_hidden_layers=2,
                num_attention_heads=2,
                num_key_value_heads=1,
                head_dim=16,
                vocab_size=128,
                max_position_embeddings=256,
                pad_token_id=0,
                eos_token_id=1,
                bos_token_id=2,
            )
        ),
    )


def clip_image_processor():
    """CLIP's image processor at 32 px (its PIL class where torchvision, which the default needs, is absent)."""
    return getattr(transformers, "CLIPImageProcessorPil", transformers.CLIPImageProcessor)(crop_size=32, size=32)


def tiny_prior(seed: int):
    """An unCLIP prior (``PriorTransformer``): CLIP text states to a 32-wide image embedding, 2 layers."""
    torch.manual_seed(seed)
    return PriorTransformer(num_attention_heads=2, attention_head_dim=16, embedding_dim=32, num_layers=2).eval()


def vl_processor(cls, tokenizer, vision_tokens: tuple[str, ...], chat_template: str | None = None):
    """A Qwen-VL processor class ``cls`` over ``tokenizer``, its ``vision_tokens`` added as single tokens; images
    only, processed with PIL (the video processor needs torchvision, which the text and image pipelines never use).
    transformers 4.x also names the tokenizer class it takes (Qwen2's): the character tokenizer stands in for it."""

    class ImageProcessorOnly(cls):
        def check_argument_for_proper_class(self, name, argument):
            if not (name == "video_processor" and argument is None or name == "tokenizer"):
                return super().check_argument_for_proper_class(name, argument)

    tokenizer.add_special_tokens({"additional_special_tokens": list(vision_tokens)})
    images = getattr(transformers, "Qwen2VLImageProcessorPil", transformers.Qwen2VLImageProcessor)()
    return ImageProcessorOnly(image_processor=images, tokenizer=tokenizer, chat_template=chat_template)


def test_image(height: int = 32, width: int = 32, seed: int = 0):
    """A deterministic RGB PIL image (for image-to-video)."""
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    return PIL.Image.fromarray(pixels)


def test_mask(height: int = 32, width: int = 32):
    """A PIL mask with its right half set (for inpainting)."""
    return PIL.Image.fromarray(((np.arange(width)[None, :] > width // 2) * 255).astype(np.uint8).repeat(height, 0))


def seeded(seed: int, build):
    """``build()`` under ``torch.manual_seed(seed)``, in eval mode."""
    torch.manual_seed(seed)
    return build().eval()


def kl_vae(seed: int, latent_channels: int = 4, blocks: int = 2, **extra):
    """A tiny ``AutoencoderKL`` (8 channels a block); SD3-style shift and scaling factors unless ``extra`` says."""
    extra = dict(dict(shift_factor=0.0609, scaling_factor=1.5035), **extra)  # SD3-style pipelines read both
    return seeded(
        seed,
        lambda: AutoencoderKL(
            block_out_channels=(8,) * blocks,
            down_block_types=("DownEncoderBlock2D",) * blocks,
            up_block_types=("UpDecoderBlock2D",) * blocks,
            norm_num_groups=2,
            latent_channels=latent_channels,
            **extra,
        ),
    )


def rebuilt(seed: int, model, **changes):
    """A fresh model of ``model``'s class and config with ``changes`` (``from_config`` would keep a changed value
    that the original left at its default at that default: it reads ``_use_default_values``)."""
    config = {k: v for k, v in model.config.items() if not k.startswith("_")}
    return seeded(seed, lambda: type(model).from_config(dict(config, **changes)))


def fit(cls_name: str, parts: dict, call: dict):
    """The diffusers class ``cls_name`` built from the parts its constructor takes, and the call arguments its
    ``__call__`` takes (a family's classes differ in both: no negative prompt for LCM, no image encoder for
    InstructPix2Pix...)."""

    cls = getattr(diffusers, cls_name)
    built = set(inspect.signature(cls.__init__).parameters)
    called = set(inspect.signature(cls.__call__).parameters)
    return cls(**{k: v for k, v in parts.items() if k in built}), {k: v for k, v in call.items() if k in called}


class PassThroughGuardrail(torch.nn.Module):
    """Stands in for Cosmos' guardrail (the ``cosmos_guardrail`` package, not installed here): every prompt and
    video passes unchanged. Stock refuses to run without a checker; this one changes no value, so the comparison
    is of the pipeline itself."""

    def __init__(self):
        super().__init__()
        self.register_buffer("_where", torch.zeros(()), persistent=False)  # the pipeline asks its modules' device

    @property
    def device(self) -> torch.device:
        return self._where.device

    @property
    def dtype(self) -> torch.dtype:
        return self._where.dtype

    def check_text_safety(self, prompt: str) -> bool:
        return True

    def check_video_safety(self, frames):
        return frames
