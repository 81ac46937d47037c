"""Tiny recipes for the parity sweep (``tests.sweep.run``): pipeline class name -> a function returning ``(pipe,
call arguments)``, components built offline from the class's own model classes (2+ layers, prompts of different
lengths, guidance on).

Over 400 lines: the table itself (one entry a class)."""

from __future__ import annotations

import diffusers

from diffusers_tpu.testing import tiny, tiny_families, tiny_generic, tiny_images, tiny_parts, tiny_unet
from diffusers_tpu.testing.tiny_families import test_frames
from diffusers_tpu.testing.tiny_parts import PROMPTS

from . import (
    tiny_conditioned_video_classes,
    tiny_family_variants,
    tiny_qwen_vl_processor_classes,
    tiny_sd15_relatives,
    tiny_token_and_grid_classes,
    tiny_transformer_classes,
    tiny_unet_samplers,
    tiny_video_classes,
)

VIDEO_CALL = dict(PROMPTS, height=32, width=32, num_frames=9, num_inference_steps=2)


def _image(height=32, width=32, seed=0):
    return tiny_parts.test_image(height, width, seed)


def _named(module, name):
    return lambda: module.pipeline(name)


DROP = object()  # a call argument the other class does not take


def _as(cls_name, build, **extra):
    """The same components under another pipeline class of the family."""

    def recipe():
        pipe, call = build()
        call = {k: v for k, v in dict(call, **extra).items() if v is not DROP}
        return getattr(diffusers, cls_name)(**pipe.components), call

    return recipe


def _wan():
    return tiny.wan_pipeline("wan-4head"), dict(VIDEO_CALL)


def _wan_i2v():
    return tiny.wan_i2v_pipeline(), dict(VIDEO_CALL, image=_image())


def _cogvideox():
    return tiny.cogvideox_pipeline("cogvideox-5b"), dict(VIDEO_CALL, max_sequence_length=32, num_frames=9)


def _hunyuan15():
    call = dict(
        prompt='a cat holding a sign saying "hello" in the rain',
        negative_prompt="blurry",
        height=32,
        width=48,
        num_frames=5,
        num_inference_steps=2,
    )
    return tiny.hunyuan15_pipeline(), call


def _causal_wan():
    return tiny.causal_wan_pipeline(), dict(
        prompt=PROMPTS["prompt"], num_blocks=3, height=32, width=48, max_sequence_length=24
    )


RECIPES = {
    "WanPipeline": _wan,
    "WanImageToVideoPipeline": _wan_i2v,
    "WanVideoToVideoPipeline": _named(tiny_families, "wan-v2v"),
    "WanVACEPipeline": _named(tiny_families, "wan-vace"),
    "WanAnimatePipeline": _named(tiny_families, "wan-animate"),
    "SkyReelsV2Pipeline": _named(tiny_families, "skyreels-v2"),
    "SkyReelsV2DiffusionForcingPipeline": _named(tiny_families, "skyreels-v2-df"),
    "CogVideoXPipeline": _cogvideox,
    "HunyuanVideoPipeline": _named(tiny_families, "hunyuan-video"),
    "HunyuanVideo15Pipeline": _hunyuan15,
    "HunyuanVideo15ImageToVideoPipeline": _named(tiny_families, "hunyuanvideo15-i2v"),
    "LTXPipeline": _named(tiny_families, "ltx"),
    "LTXImageToVideoPipeline": _named(tiny_families, "ltx-i2v"),
    "LTX2Pipeline": _named(tiny_families, "ltx2"),
    "LTX2ImageToVideoPipeline": _named(tiny_families, "ltx2-i2v"),
    "CausalWanPipeline": _causal_wan,
    "FluxPipeline": _named(tiny_images, "flux"),
    "QwenImagePipeline": _named(tiny_images, "qwen-image"),
    "ZImagePipeline": _named(tiny_images, "z-image"),
    "NucleusMoEImagePipeline": _named(tiny_images, "nucleusmoe-image"),
    **{
        cls: (
            lambda name=name, cls=cls: (
                tiny_generic.generic_pipeline(name),
                {k: v for k, v in tiny_generic.CALLS[cls].items() if k != "output_type"},
            )
        )
        for name, cls in (
            ("latte", "LattePipeline"),
            ("mochi", "MochiPipeline"),
            ("easyanimate", "EasyAnimatePipeline"),
        )
    },
    **{
        cls: _named(tiny_unet, name)
        for name, cls in (
            ("sd", "StableDiffusionPipeline"),
            ("sd-img2img", "StableDiffusionImg2ImgPipeline"),
            ("sd-inpaint", "StableDiffusionInpaintPipeline"),
            ("sd-controlnet", "StableDiffusionControlNetPipeline"),
            ("sdxl", "StableDiffusionXLPipeline"),
            ("svd", "StableVideoDiffusionPipeline"),
            ("animatediff", "AnimateDiffPipeline"),
        )
    },
}
# the same components under the family's other classes
RECIPES.update(
    {
        "SkyReelsV2DiffusionForcingVideoToVideoPipeline": _as(
            "SkyReelsV2DiffusionForcingVideoToVideoPipeline",
            _named(tiny_families, "skyreels-v2-df"),
            video=test_frames(9),
            num_frames=9,
            overlap_history=5,
            base_num_frames=9,
        ),
        "CogVideoXVideoToVideoPipeline": _as(
            "CogVideoXVideoToVideoPipeline", _cogvideox, video=test_frames(9), strength=0.8, num_frames=DROP
        ),
        "FluxImg2ImgPipeline": _as(
            "FluxImg2ImgPipeline", _named(tiny_images, "flux"), image=_image(16, 16), strength=0.8
        ),
        "FluxInpaintPipeline": _as(
            "FluxInpaintPipeline",
            _named(tiny_images, "flux"),
            image=_image(16, 16),
            mask_image=tiny_parts.test_mask(16, 16),
            strength=0.8,
        ),
        "FluxKontextPipeline": _as(
            "FluxKontextPipeline",
            _named(tiny_images, "flux"),
            image=_image(16, 16),
            _auto_resize=False,
            max_area=16 * 16,
        ),
        "QwenImageImg2ImgPipeline": _as(
            "QwenImageImg2ImgPipeline", _named(tiny_images, "qwen-image"), image=_image(), strength=0.8
        ),
        "QwenImageInpaintPipeline": _as(
            "QwenImageInpaintPipeline",
            _named(tiny_images, "qwen-image"),
            image=_image(),
            mask_image=tiny_parts.test_mask(),
            strength=0.8,
        ),
        "ZImageImg2ImgPipeline": _as(
            "ZImageImg2ImgPipeline", _named(tiny_images, "z-image"), image=_image(), strength=0.8
        ),
        "ZImageInpaintPipeline": _as(
            "ZImageInpaintPipeline",
            _named(tiny_images, "z-image"),
            image=_image(),
            mask_image=tiny_parts.test_mask(),
            strength=0.8,
        ),
        "StableDiffusionXLImg2ImgPipeline": _as(
            "StableDiffusionXLImg2ImgPipeline", _named(tiny_unet, "sdxl"), image=_image(), strength=0.8
        ),
    }
)


def _sweep(build, cls_name=None, **extra):
    def recipe():
        pipe, call = build(cls_name=cls_name) if cls_name else build()
        return pipe, dict(call, **extra)

    return recipe


# pipelines only the sweep builds (testing/tiny_transformer_classes.py)
RECIPES.update(
    {
        "StableDiffusion3Pipeline": _sweep(tiny_transformer_classes.sd3),
        "StableDiffusion3Img2ImgPipeline": _sweep(
            tiny_transformer_classes.sd3, "StableDiffusion3Img2ImgPipeline", image=_image(), strength=0.8
        ),
        "StableDiffusion3InpaintPipeline": _sweep(
            tiny_transformer_classes.sd3,
            "StableDiffusion3InpaintPipeline",
            image=_image(),
            mask_image=tiny_parts.test_mask(),
            strength=0.8,
        ),
        "StableDiffusion3PAGPipeline": _sweep(
            tiny_transformer_classes.sd3, "StableDiffusion3PAGPipeline", pag_scale=2.0
        ),
        "StableDiffusion3PAGImg2ImgPipeline": _sweep(
            tiny_transformer_classes.sd3,
            "StableDiffusion3PAGImg2ImgPipeline",
            image=_image(),
            strength=0.8,
            pag_scale=2.0,
        ),
        "PixArtAlphaPipeline": _sweep(tiny_transformer_classes.pixart, "PixArtAlphaPipeline"),
        "PixArtSigmaPipeline": _sweep(tiny_transformer_classes.pixart, "PixArtSigmaPipeline"),
        "PixArtSigmaPAGPipeline": _sweep(tiny_transformer_classes.pixart, "PixArtSigmaPAGPipeline", pag_scale=2.0),
        "AuraFlowPipeline": _sweep(tiny_transformer_classes.auraflow),
        "SanaPipeline": _sweep(tiny_transformer_classes.sana, "SanaPipeline"),
        "SanaPAGPipeline": _sweep(tiny_transformer_classes.sana, "SanaPAGPipeline", pag_scale=2.0),
        "AllegroPipeline": _sweep(tiny_transformer_classes.allegro),
        "CogView3PlusPipeline": _sweep(tiny_transformer_classes.cogview3),
        "ChromaPipeline": _sweep(tiny_transformer_classes.chroma, "ChromaPipeline"),
        "ChromaImg2ImgPipeline": _sweep(
            tiny_transformer_classes.chroma, "ChromaImg2ImgPipeline", image=_image(), strength=0.8
        ),
        "Lumina2Pipeline": _sweep(tiny_transformer_classes.lumina2),
        "HeliosPipeline": _sweep(tiny_transformer_classes.helios),
        "LucyEditPipeline": _sweep(tiny_transformer_classes.lucy_edit),
        "HunyuanDiTPipeline": _sweep(tiny_transformer_classes.hunyuan_dit, "HunyuanDiTPipeline"),
        "HunyuanDiTPAGPipeline": _sweep(tiny_transformer_classes.hunyuan_dit, "HunyuanDiTPAGPipeline", pag_scale=2.0),
        "CogView4Pipeline": _sweep(tiny_transformer_classes.cogview4),
        "LTXConditionPipeline": _as("LTXConditionPipeline", _named(tiny_families, "ltx")),
        "CogVideoXImageToVideoPipeline": _sweep(
            tiny_transformer_classes.cogvideox_i2v, "CogVideoXImageToVideoPipeline"
        ),
        "CogVideoXFunControlPipeline": _sweep(tiny_transformer_classes.cogvideox_i2v, "CogVideoXFunControlPipeline"),
        "SkyReelsV2ImageToVideoPipeline": _sweep(
            tiny_transformer_classes.skyreels_i2v, "SkyReelsV2ImageToVideoPipeline"
        ),
        "SkyReelsV2DiffusionForcingImageToVideoPipeline": _sweep(
            tiny_transformer_classes.skyreels_i2v, "SkyReelsV2DiffusionForcingImageToVideoPipeline"
        ),
        "TextToVideoSDPipeline": _sweep(tiny_transformer_classes.text_to_video_sd, "TextToVideoSDPipeline"),
        "VideoToVideoSDPipeline": _sweep(tiny_transformer_classes.text_to_video_sd, "VideoToVideoSDPipeline"),
        "AnimateDiffVideoToVideoPipeline": _sweep(tiny_transformer_classes.animatediff_v2v),
    }
)


def _controlnet_variant(cls_name, **extra):
    """SD 1.5 ControlNet's components under its img2img / inpaint classes: the control image beside the image."""

    def recipe():
        pipe, call = tiny_unet.pipeline("sd-controlnet")
        control = call.pop("image")
        return getattr(diffusers, cls_name)(**pipe.components), dict(
            call, image=_image(), control_image=control, **extra
        )

    return recipe


RECIPES.update(
    {
        "StableDiffusionXLInpaintPipeline": _as(
            "StableDiffusionXLInpaintPipeline",
            _named(tiny_unet, "sdxl"),
            image=_image(),
            mask_image=tiny_parts.test_mask(),
            strength=0.8,
        ),
        "StableDiffusionControlNetImg2ImgPipeline": _controlnet_variant(
            "StableDiffusionControlNetImg2ImgPipeline", strength=0.8
        ),
        "StableDiffusionControlNetInpaintPipeline": _controlnet_variant(
            "StableDiffusionControlNetInpaintPipeline", mask_image=tiny_parts.test_mask(), strength=0.8
        ),
        "LTX2ConditionPipeline": _as("LTX2ConditionPipeline", _named(tiny_families, "ltx2")),
        "AnyFlowPipeline": _sweep(tiny_transformer_classes.anyflow),
        "AnyFlowFARPipeline": _sweep(tiny_transformer_classes.anyflow_far),
        "ChronoEditPipeline": _sweep(tiny_transformer_classes.chrono_edit),
        "SanaVideoPipeline": _sweep(tiny_transformer_classes.sana_video),
        "HunyuanSkyreelsImageToVideoPipeline": _sweep(tiny_transformer_classes.hunyuan_skyreels_i2v),
        "AnimateDiffPAGPipeline": _as("AnimateDiffPAGPipeline", _named(tiny_unet, "animatediff"), pag_scale=2.0),
    }
)

# video pipelines only the sweep builds (testing/tiny_video_classes.py)
RECIPES.update(
    {
        "AnimateDiffControlNetPipeline": _sweep(
            tiny_video_classes.animatediff_controlnet, "AnimateDiffControlNetPipeline"
        ),
        "AnimateDiffVideoToVideoControlNetPipeline": _sweep(
            tiny_video_classes.animatediff_controlnet, "AnimateDiffVideoToVideoControlNetPipeline"
        ),
        "AnimateDiffSparseControlNetPipeline": _sweep(tiny_video_classes.animatediff_sparse),
        "AnimateDiffSDXLPipeline": _sweep(tiny_video_classes.animatediff_sdxl),
        "PIAPipeline": _sweep(tiny_video_classes.pia),
        "I2VGenXLPipeline": _sweep(tiny_video_classes.i2vgen_xl),
        "TextToVideoZeroPipeline": _sweep(tiny_video_classes.text_to_video_zero),
        "TextToVideoZeroSDXLPipeline": _sweep(tiny_video_classes.text_to_video_zero_sdxl),
        "EasyAnimateInpaintPipeline": _sweep(tiny_video_classes.easyanimate_inpaint),
        "EasyAnimateControlPipeline": _sweep(tiny_video_classes.easyanimate_control),
    }
)

# a family's components under its other classes (testing/tiny_family_variants.py)
_VARIANTS = {
    tiny_family_variants.sd_variant: (
        "StableDiffusionPAGPipeline",
        "StableDiffusionPAGImg2ImgPipeline",
        "StableDiffusionPAGInpaintPipeline",
        "StableDiffusionControlNetPAGPipeline",
        "StableDiffusionControlNetPAGInpaintPipeline",
        "LatentConsistencyModelPipeline",
        "LatentConsistencyModelImg2ImgPipeline",
        "StableDiffusionInstructPix2PixPipeline",
        "StableDiffusionPanoramaPipeline",
        "StableDiffusionSAGPipeline",
        "SemanticStableDiffusionPipeline",
        "StableDiffusionParadigmsPipeline",
        "StableDiffusionModelEditingPipeline",
        "CycleDiffusionPipeline",
        "StableDiffusionAttendAndExcitePipeline",
    ),
    tiny_family_variants.sdxl_variant: (
        "StableDiffusionXLPAGPipeline",
        "StableDiffusionXLPAGImg2ImgPipeline",
        "StableDiffusionXLPAGInpaintPipeline",
        "StableDiffusionXLControlNetPipeline",
        "StableDiffusionXLControlNetImg2ImgPipeline",
        "StableDiffusionXLControlNetInpaintPipeline",
        "StableDiffusionXLControlNetPAGPipeline",
        "StableDiffusionXLControlNetPAGImg2ImgPipeline",
        "StableDiffusionXLControlNetUnionPipeline",
        "StableDiffusionXLControlNetUnionImg2ImgPipeline",
        "StableDiffusionXLControlNetUnionInpaintPipeline",
        "StableDiffusionXLInstructPix2PixPipeline",
        "StableDiffusionXLAdapterPipeline",
    ),
    tiny_family_variants.flux_variant: (
        "FluxControlPipeline",
        "FluxControlImg2ImgPipeline",
        "FluxControlInpaintPipeline",
        "FluxFillPipeline",
        "FluxControlNetPipeline",
        "FluxControlNetImg2ImgPipeline",
        "FluxControlNetInpaintPipeline",
    ),
}
RECIPES.update({cls: _sweep(build, cls) for build, classes in _VARIANTS.items() for cls in classes})
_VARIANTS2 = {
    tiny_family_variants.sd_conditioned: (
        "StableDiffusionImageVariationPipeline",
        "StableDiffusionAdapterPipeline",
        "StableDiffusionLDM3DPipeline",
        "StableDiffusionUpscalePipeline",
    )
}
RECIPES.update({cls: _sweep(build, cls) for build, classes in _VARIANTS2.items() for cls in classes})


def _variant_of(base, cls_name, variant=tiny_family_variants.other_variant):
    """A class built from another recipe's tiny ``(pipe, call)`` (``base``, built with that class's own name)."""
    return lambda: variant(base(), cls_name)


RECIPES.update(
    {
        "ChromaInpaintPipeline": _variant_of(
            lambda: tiny_transformer_classes.chroma(0, "ChromaInpaintPipeline"), "ChromaInpaintPipeline"
        ),
        "StableDiffusion3ControlNetPipeline": _variant_of(
            tiny_transformer_classes.sd3, "StableDiffusion3ControlNetPipeline"
        ),
        "StableDiffusion3ControlNetInpaintingPipeline": _variant_of(
            lambda: tiny_transformer_classes.sd3(0, "StableDiffusion3InpaintPipeline"),
            "StableDiffusion3ControlNetInpaintingPipeline",
        ),
        "CogView4ControlPipeline": _variant_of(tiny_transformer_classes.cogview4, "CogView4ControlPipeline"),
        "SanaSprintPipeline": _variant_of(tiny_transformer_classes.sana, "SanaSprintPipeline"),
        "SanaSprintImg2ImgPipeline": _variant_of(tiny_transformer_classes.sana, "SanaSprintImg2ImgPipeline"),
        "FluxKontextInpaintPipeline": _sweep(tiny_family_variants.flux_kontext_inpaint),
        "HeliosPyramidPipeline": lambda: tiny_video_classes.helios_pyramid(tiny_transformer_classes.helios()),
        "SanaImageToVideoPipeline": lambda: tiny_video_classes.sana_i2v(tiny_transformer_classes.sana_video()),
    }
)
RECIPES["DiTPipeline"] = _sweep(tiny_family_variants.dit)
RECIPES.update(
    {
        "LTX2InContextPipeline": _sweep(tiny_video_classes.ltx2_reference, "LTX2InContextPipeline"),
        "LTX2HDRPipeline": _sweep(tiny_video_classes.ltx2_reference, "LTX2HDRPipeline"),
        "LTXI2VLongMultiPromptPipeline": _sweep(tiny_video_classes.ltx_long_multi_prompt),
        "LTXLatentUpsamplePipeline": _sweep(tiny_video_classes.ltx_latent_upsample),
        "LTX2LatentUpsamplePipeline": _sweep(lambda: tiny_video_classes.ltx_latent_upsample(ltx2=True)),
    }
)
RECIPES.update(
    {
        cls: _sweep(tiny_video_classes.cosmos2, cls)
        for cls in ("Cosmos2TextToImagePipeline", "Cosmos2VideoToWorldPipeline")
    }
)
_VARIANTS3 = {
    tiny_unet_samplers.unconditional: (
        "DDPMPipeline",
        "DDIMPipeline",
        "PNDMPipeline",
        "LDMPipeline",
        "ConsistencyModelPipeline",
    ),
    tiny_unet_samplers.kandinsky22: (
        "KandinskyV22Pipeline",
        "KandinskyV22Img2ImgPipeline",
        "KandinskyV22InpaintPipeline",
        "KandinskyV22ControlnetPipeline",
        "KandinskyV22ControlnetImg2ImgPipeline",
    ),
    tiny_unet_samplers.kandinsky22_combined: (
        "KandinskyV22CombinedPipeline",
        "KandinskyV22Img2ImgCombinedPipeline",
        "KandinskyV22InpaintCombinedPipeline",
    ),
    tiny_unet_samplers.kandinsky21: (
        "KandinskyPipeline",
        "KandinskyImg2ImgPipeline",
        "KandinskyInpaintPipeline",
        "KandinskyCombinedPipeline",
        "KandinskyImg2ImgCombinedPipeline",
        "KandinskyInpaintCombinedPipeline",
    ),
    tiny_unet_samplers.deepfloyd_if: (
        "IFPipeline",
        "IFImg2ImgPipeline",
        "IFInpaintingPipeline",
        "IFSuperResolutionPipeline",
        "IFImg2ImgSuperResolutionPipeline",
        "IFInpaintingSuperResolutionPipeline",
    ),
}
RECIPES.update({cls: _sweep(build, cls) for build, classes in _VARIANTS3.items() for cls in classes})
RECIPES.update(
    {
        cls: _sweep(tiny_video_classes.cosmos1, cls)
        for cls in ("CosmosTextToWorldPipeline", "CosmosVideoToWorldPipeline")
    }
)
RECIPES["HunyuanVideoFramepackPipeline"] = _sweep(tiny_video_classes.hunyuan_framepack)
RECIPES.update(
    {cls: _sweep(tiny_video_classes.motif, cls) for cls in ("MotifVideoPipeline", "MotifVideoImage2VideoPipeline")}
)
RECIPES.update(
    {cls: _sweep(tiny_unet_samplers.kandinsky3, cls) for cls in ("Kandinsky3Pipeline", "Kandinsky3Img2ImgPipeline")}
)
RECIPES.update(
    {
        "QwenImageControlNetPipeline": _variant_of(lambda: tiny_images.qwen_image(0), "QwenImageControlNetPipeline"),
        **{
            cls: _sweep(tiny_family_variants.marigold, cls)
            for cls in ("MarigoldDepthPipeline", "MarigoldNormalsPipeline", "MarigoldIntrinsicsPipeline")
        },
    }
)
RECIPES.update(
    {
        "HunyuanDiTControlNetPipeline": _variant_of(
            lambda: tiny_transformer_classes.hunyuan_dit(0, "HunyuanDiTPipeline"), "HunyuanDiTControlNetPipeline"
        ),
        "SanaControlNetPipeline": _variant_of(tiny_transformer_classes.sana, "SanaControlNetPipeline"),
    }
)
RECIPES.update(
    {
        cls: _variant_of(lambda: tiny_images.z_image(0), cls)
        for cls in ("ZImageControlNetPipeline", "ZImageControlNetInpaintPipeline")
    }
)
RECIPES["QwenImageControlNetInpaintPipeline"] = _variant_of(
    lambda: tiny_images.qwen_image(0), "QwenImageControlNetInpaintPipeline"
)
RECIPES.update(
    {
        cls: _sweep(build, cls) if len(classes) > 1 else _sweep(build)
        for build, classes in tiny_sd15_relatives.BUILDERS.items()
        for cls in classes
    }
)
RECIPES.update(
    {
        cls: _sweep(tiny_qwen_vl_processor_classes.qwen_image_edit, cls)
        for cls in ("QwenImageEditPipeline", "QwenImageEditPlusPipeline", "QwenImageEditInpaintPipeline")
    }
)
RECIPES.update(
    {cls: _sweep(build, cls) for build, classes in tiny_token_and_grid_classes.BUILDERS.items() for cls in classes}
)
RECIPES.update(tiny_token_and_grid_classes.RECIPES)
RECIPES.update(
    {
        cls: _sweep(tiny_qwen_vl_processor_classes.kandinsky5, cls)
        for cls in ("Kandinsky5T2VPipeline", "Kandinsky5I2VPipeline", "Kandinsky5T2IPipeline", "Kandinsky5I2IPipeline")
    }
)
RECIPES["Cosmos2_5_PredictBasePipeline"] = _sweep(tiny_qwen_vl_processor_classes.cosmos25)
RECIPES["Kandinsky6TI2VAPipeline"] = tiny_qwen_vl_processor_classes.kandinsky6
RECIPES["Cosmos2_5_TransferPipeline"] = tiny_qwen_vl_processor_classes.cosmos25_transfer
RECIPES.update(tiny_conditioned_video_classes.RECIPES)
