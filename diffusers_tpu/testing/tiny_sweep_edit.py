"""Tiny offline image-editing pipelines that only the parity sweep builds: Qwen-Image's edit classes, whose
Qwen2.5-VL encoder reads the input image beside the instruction (a processor expands the template's image token
into one token per merged 28x28 patch), and its layered decomposition: each ``(pipe, call arguments)``."""

from __future__ import annotations

import functools

import torch

from . import tiny_images
from .tiny import fit, test_image, test_mask

VISION_TOKENS = ("<|image_pad|>", "<|vision_start|>", "<|vision_end|>")


def _processor(tokenizer):
    """Qwen2-VL's processor over the character tokenizer, its vision tokens added as single tokens; images only,
    processed with PIL (its video processor needs torchvision, which the edit pipelines never use)."""
    import transformers

    class ImageProcessorOnly(transformers.Qwen2VLProcessor):
        def check_argument_for_proper_class(self, name, argument):
            if not (name == "video_processor" and argument is None):
                return super().check_argument_for_proper_class(name, argument)

    tokenizer.add_special_tokens({"additional_special_tokens": list(VISION_TOKENS)})
    images = getattr(transformers, "Qwen2VLImageProcessorPil", transformers.Qwen2VLImageProcessor)()
    return ImageProcessorOnly(image_processor=images, tokenizer=tokenizer)


def _small_reference_images():
    """Stock sizes a reference image to a fixed area whatever the output's size (1024² for the VAE, 384² for the VL
    encoder): 4,096 image tokens, beyond a CPU sweep. The recipe caps that area at 64² in the edit modules (test
    harness only, for stock and JAX alike; the pipelines' code is otherwise stock's)."""
    import importlib

    for name in ("pipeline_qwenimage_edit", "pipeline_qwenimage_edit_inpaint", "pipeline_qwenimage_edit_plus"):
        module = importlib.import_module(f"diffusers.pipelines.qwenimage.{name}")
        stock = module.calculate_dimensions
        if not getattr(stock, "_tiny_sweep", False):
            capped = functools.partial(lambda area, ratio, stock: stock(min(area, 64 * 64), ratio), stock=stock)
            capped._tiny_sweep = True
            module.calculate_dimensions = capped


def qwen_image_edit(seed: int = 0, cls_name: str = "QwenImageEditPipeline"):
    """Qwen-Image edit, edit-plus (several reference images) and edit-inpaint: the reference image's latents join
    the noise tokens; the VL encoder sees it too. One prompt a call (stock's processor pairs one image with every
    prompt's image token)."""
    _small_reference_images()
    pipe, call = tiny_images.qwen_image(seed)
    processor = _processor(pipe.tokenizer)
    ids = {name: pipe.tokenizer.convert_tokens_to_ids(token) for name, token in zip(
        ("image_token_id", "vision_start_token_id", "vision_end_token_id"), VISION_TOKENS)}
    encoder = pipe.text_encoder
    config = encoder.config.to_dict()
    config.update(ids)
    torch.manual_seed(seed + 2)
    encoder = type(encoder)(type(encoder.config).from_dict(config)).eval()
    parts = dict(pipe.components, text_encoder=encoder, processor=processor)
    image = test_image(seed=seed + 3)
    call = dict(call, image=[image, test_image(seed=seed + 4)] if cls_name == "QwenImageEditPlusPipeline" else image,
                prompt=call["prompt"][1], negative_prompt=call["negative_prompt"][0])
    if "Inpaint" in cls_name:
        call.update(mask_image=test_mask(), strength=0.8)
    built, call = fit(cls_name, parts, call)
    # the template's shape with a short system part (``tiny_images.qwen_image``): the first 3 tokens dropped
    built.prompt_template_encode = "<s>" + "".join(
        (VISION_TOKENS[1], VISION_TOKENS[0], VISION_TOKENS[2])) + "{}<e>"
    built.prompt_template_encode_start_idx = 3
    if cls_name == "QwenImageEditPlusPipeline":  # it writes "Picture i: <vision tokens>" per image itself
        built.prompt_template_encode = "<s>{}<e>"
    return built, call
