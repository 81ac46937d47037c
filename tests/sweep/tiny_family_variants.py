"""Tiny offline pipelines for the parity sweep that reuse a family's tiny components under its other classes
(SD 1.5 / SDXL guidance and control variants, Flux control / fill / ControlNet, ...), with what each class adds
(a ControlNet, a wider UNet input, a scheduler): each ``(pipe, call arguments)``.

Over 400 lines: one small builder per pipeline class, written out as ``ruff format`` lays them."""

from __future__ import annotations

import diffusers
import torch
from diffusers import DiTPipeline, DiTTransformer2DModel
from transformers import CLIPVisionConfig, CLIPVisionModelWithProjection

from diffusers_tpu.testing import tiny_images, tiny_unet
from diffusers_tpu.testing.tiny import CLIP_VISION
from diffusers_tpu.testing.tiny_parts import clip_image_processor, fit, kl_vae, rebuilt, seeded, test_image, test_mask

PROMPTS = tiny_unet.PROMPTS


def _sd(seed, **unet):
    return tiny_unet._sd_parts(seed, unet or None)


def sd_variant(seed: int = 0, cls_name: str = "StableDiffusionPAGPipeline"):
    """SD 1.5's components under a guidance / editing class: PAG (text, img2img, inpaint, ControlNet), LCM,
    InstructPix2Pix, Panorama, SAG, SEGA, Paradigms, model editing, CycleDiffusion, Attend-and-Excite."""
    inpaint = "Inpaint" in cls_name
    unet = {}
    if inpaint:
        unet["in_channels"] = 9  # noise + masked image latents + mask
    elif "InstructPix2Pix" in cls_name:
        unet["in_channels"] = 8  # noise + image latents
    elif "LatentConsistency" in cls_name:
        unet["time_cond_proj_dim"] = 32  # LCM's guidance embedding
    parts = _sd(seed, **unet)
    call = dict(PROMPTS, height=32, width=32, num_inference_steps=2)
    if "PAG" in cls_name:
        call.update(pag_scale=2.0)
    if "ControlNet" in cls_name:
        parts["controlnet"] = tiny_unet.controlnet(seed + 3)
        call.update(control_image=test_image(seed=seed + 5)) if inpaint else call.update(
            image=test_image(seed=seed + 5)
        )
    if inpaint:
        call.update(image=test_image(), mask_image=test_mask(), strength=0.8)
    elif "Img2Img" in cls_name:
        call.update(image=test_image(), strength=0.8)
    if "LatentConsistency" in cls_name:
        parts["scheduler"] = diffusers.LCMScheduler(beta_schedule="scaled_linear", beta_start=0.00085, beta_end=0.012)
    if "InstructPix2Pix" in cls_name:
        call = dict(PROMPTS, image=test_image(), num_inference_steps=2, image_guidance_scale=1.5)
    if "Panorama" in cls_name:
        call.update(width=64)
    if "SAG" in cls_name:
        call.update(sag_scale=0.75)
    if "Semantic" in cls_name:
        call.update(
            editing_prompt=["a dog", "snow"],
            edit_guidance_scale=5.0,
            edit_warmup_steps=0,
            reverse_editing_direction=[False, True],
            edit_threshold=0.9,
        )
    if "Paradigms" in cls_name:
        parts["scheduler"] = diffusers.DDPMParallelScheduler(
            beta_schedule="scaled_linear", beta_start=0.00085, beta_end=0.012
        )
        call.update(num_inference_steps=4, parallel=2)
    if "Cycle" in cls_name:
        call = dict(
            prompt=PROMPTS["prompt"],
            source_prompt=["a cat", "a fox in the snow"],
            image=test_image(),
            num_inference_steps=4,
            strength=0.8,
        )
    if "AttendAndExcite" in cls_name:
        call = dict(
            prompt="a cat and a dog",
            negative_prompt="blurry",
            token_indices=[2, 4],
            height=32,
            width=32,
            num_inference_steps=2,
            max_iter_to_alter=2,
        )
    return fit(cls_name, parts, call)


def _sdxl_parts(seed, **unet):
    pipe, _ = tiny_unet.sdxl(seed)
    parts = dict(pipe.components)
    if unet:
        parts["unet"] = rebuilt(seed, pipe.unet, **unet)
    return parts


def _sdxl_controlnet(seed, union=False):
    config = dict(
        block_out_channels=(8, 16),
        layers_per_block=2,
        in_channels=4,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        attention_head_dim=(2, 4),
        use_linear_projection=True,
        addition_embed_type="text_time",
        addition_time_embed_dim=8,
        transformer_layers_per_block=(1, 2),
        projection_class_embeddings_input_dim=80,
        cross_attention_dim=64,
        norm_num_groups=4,
        conditioning_embedding_out_channels=(8, 8),
    )
    if union:  # its control-type transformer at the first block's width
        return seeded(
            seed,
            lambda: diffusers.ControlNetUnionModel(
                **config, num_trans_channel=8, num_trans_head=2, num_trans_layer=2, num_proj_channel=8
            ),
        )
    return seeded(seed, lambda: diffusers.ControlNetModel(**config))


def sdxl_variant(seed: int = 0, cls_name: str = "StableDiffusionXLPAGPipeline"):
    """SDXL's components under its PAG, ControlNet (and union), InstructPix2Pix and T2I-adapter classes."""
    inpaint = "Inpaint" in cls_name
    unet = dict(in_channels=8) if "InstructPix2Pix" in cls_name else {}
    if inpaint and "Union" not in cls_name:  # the union inpaint class takes SDXL's own 4-channel UNet only
        unet = dict(in_channels=9)
    parts = _sdxl_parts(seed, **unet)
    call = dict(PROMPTS, height=32, width=32, num_inference_steps=2)
    if "PAG" in cls_name:
        call.update(pag_scale=2.0)
    if "ControlNet" in cls_name:
        union = "Union" in cls_name
        parts["controlnet"] = _sdxl_controlnet(seed + 5, union)
        control = test_image(seed=seed + 5)
        if union:  # one control image, its type given by index
            call.update(control_image=[control], control_mode=[0])
        elif inpaint or "Img2Img" in cls_name:
            call.update(control_image=control)
        else:
            call.update(image=control)
    if inpaint:
        call.update(image=test_image(), mask_image=test_mask(), strength=0.8)
    elif "Img2Img" in cls_name:
        call.update(image=test_image(), strength=0.8)
    if "InstructPix2Pix" in cls_name:
        call = dict(PROMPTS, image=test_image(), num_inference_steps=2, image_guidance_scale=1.5)
    if "Adapter" in cls_name:  # SDXL's adapter layout: features at the UNet's first two resolutions
        parts["adapter"] = seeded(
            seed + 3,
            lambda: diffusers.T2IAdapter(
                in_channels=3, channels=[8, 16], num_res_blocks=2, downscale_factor=4, adapter_type="full_adapter_xl"
            ),
        )
        call.update(image=[test_image(seed=seed + 5), test_image(seed=seed + 6)], adapter_conditioning_scale=0.8)
    return fit(cls_name, parts, call)


def _flux_parts(seed, in_channels=None):
    pipe, call = tiny_images.flux(seed)
    parts = {k: v for k, v in pipe.components.items() if k not in ("image_encoder", "feature_extractor")}
    if in_channels:
        parts["transformer"] = rebuilt(
            seed, pipe.transformer, in_channels=in_channels, out_channels=pipe.transformer.config.in_channels
        )
    return parts, call


def flux_variant(seed: int = 0, cls_name: str = "FluxControlPipeline"):
    """Flux's components under its control (latents of the control image beside the noise), fill and ControlNet
    classes."""
    image, control = test_image(16, 16), test_image(16, 16, seed + 5)
    if cls_name.startswith("FluxControlNet"):
        parts, call = _flux_parts(seed)
        transformer = parts["transformer"].config
        parts["controlnet"] = seeded(
            seed + 6,
            lambda: diffusers.FluxControlNetModel(
                patch_size=1,
                in_channels=transformer.in_channels,
                num_layers=2,
                num_single_layers=2,
                attention_head_dim=16,
                num_attention_heads=4,
                joint_attention_dim=32,
                pooled_projection_dim=32,
                axes_dims_rope=[4, 4, 8],
            ),
        )
        call.update(control_image=control, controlnet_conditioning_scale=0.7)
    elif cls_name.startswith("FluxControl"):
        parts, call = _flux_parts(seed, in_channels=8)
        call.update(control_image=control)
    else:  # fill: noise + masked image latents + the mask, packed
        parts, call = _flux_parts(seed, in_channels=4 + 4 + 4)
        call.update(image=image, mask_image=test_mask(16, 16))
    if "Inpaint" in cls_name:
        call.update(image=image, mask_image=test_mask(16, 16), strength=0.8)
    elif "Img2Img" in cls_name:
        call.update(image=image, strength=0.8)
    return fit(cls_name, parts, call)


def other_variant(base, cls_name: str):
    """The sweep's own image families (``base``: their ``(pipe, call)`` from ``tiny_transformer_classes``) under
    their other classes: Chroma inpaint, SD3 ControlNet (and its inpainting), CogView4 control, Sana Sprint (and
    img2img)."""
    pipe, call = base
    image = test_image()
    if cls_name == "ChromaInpaintPipeline":
        return pipe, dict(call, image=image, mask_image=test_mask(), strength=0.8)
    if cls_name.startswith("StableDiffusion3ControlNet"):
        inpaint = "Inpaint" in cls_name
        t = pipe.transformer.config
        controlnet = seeded(
            6,
            lambda: diffusers.SD3ControlNetModel(
                sample_size=32,
                patch_size=1,
                in_channels=t.in_channels,
                num_layers=2,
                attention_head_dim=8,
                num_attention_heads=4,
                joint_attention_dim=32,
                caption_projection_dim=32,
                pooled_projection_dim=64,
                out_channels=t.out_channels,
                extra_conditioning_channels=1 if inpaint else 0,
            ),
        )
        call = dict(call, control_image=test_image(seed=5), controlnet_conditioning_scale=0.7)
        if inpaint:
            call.update(control_mask=test_mask())
        return fit(cls_name, dict(pipe.components, controlnet=controlnet), call)
    if cls_name == "CogView4ControlPipeline":
        parts = dict(pipe.components, transformer=rebuilt(0, pipe.transformer, in_channels=8))
        return fit(cls_name, parts, dict(call, control_image=test_image(seed=5)))
    if cls_name.startswith("SanaSprint"):
        transformer = rebuilt(0, pipe.transformer, guidance_embeds=True, qk_norm="rms_norm_across_heads")
        with (
            torch.no_grad()
        ):  # the linear attention's denominator kept away from 0 (see ``tiny_transformer_classes.sana``)
            for block in transformer.transformer_blocks:
                block.attn1.to_q.bias.fill_(1.0)
                block.attn1.to_k.bias.fill_(1.0)
        parts = dict(pipe.components, transformer=transformer, scheduler=diffusers.SCMScheduler())
        call = dict(
            call, num_inference_steps=2, guidance_scale=4.5, intermediate_timesteps=None, use_resolution_binning=False
        )
        if "Img2Img" in cls_name:
            call.update(image=image, strength=0.8)
        return fit(cls_name, parts, call)
    if cls_name.startswith("QwenImageControlNet"):  # inpainting: the masked image's latents and the mask (packed 2x2)
        t, inpaint = pipe.transformer.config, "Inpaint" in cls_name
        controlnet = seeded(
            6,
            lambda: diffusers.QwenImageControlNetModel.from_transformer(
                pipe.transformer,
                num_layers=2,
                attention_head_dim=t.attention_head_dim,
                num_attention_heads=t.num_attention_heads,
                load_weights_from_transformer=False,
                extra_condition_channels=4 if inpaint else 0,
            ),
        )
        call = dict(call, control_image=test_image(seed=5), controlnet_conditioning_scale=0.7)
        if inpaint:
            call.update(control_mask=test_mask())
        return fit(cls_name, dict(pipe.components, controlnet=controlnet), call)
    if cls_name == "HunyuanDiTControlNetPipeline":
        controlnet = seeded(
            6,
            lambda: diffusers.HunyuanDiT2DControlNetModel.from_transformer(
                pipe.transformer, transformer_num_layers=2, load_weights_from_transformer=False
            ),
        )
        call = dict(call, control_image=test_image(64, 64, seed=5), controlnet_conditioning_scale=0.7)
        return fit(cls_name, dict(pipe.components, controlnet=controlnet), call)
    if cls_name == "SanaControlNetPipeline":
        t = pipe.transformer.config
        controlnet = seeded(
            6,
            lambda: diffusers.SanaControlNetModel(
                in_channels=t.in_channels,
                out_channels=t.out_channels,
                num_attention_heads=t.num_attention_heads,
                attention_head_dim=t.attention_head_dim,
                num_layers=2,
                num_cross_attention_heads=t.num_cross_attention_heads,
                cross_attention_head_dim=t.cross_attention_head_dim,
                cross_attention_dim=t.cross_attention_dim,
                caption_channels=t.caption_channels,
                sample_size=t.sample_size,
                patch_size=t.patch_size,
                attention_bias=True,
            ),
        )
        with (
            torch.no_grad()
        ):  # the linear attention's denominator kept away from 0 (see ``tiny_transformer_classes.sana``)
            for block in controlnet.transformer_blocks:
                block.attn1.to_q.bias.fill_(1.0)
                block.attn1.to_k.bias.fill_(1.0)
        call = dict(call, control_image=test_image(seed=5), controlnet_conditioning_scale=0.7)
        return fit(cls_name, dict(pipe.components, controlnet=controlnet), call)
    if cls_name.startswith("ZImageControlNet"):  # the ControlNet shares the transformer's embedders and refiners
        t, inpaint = pipe.transformer.config, "Inpaint" in cls_name  # inpainting: + mask + masked image's latents
        controlnet = seeded(
            6,
            lambda: diffusers.ZImageControlNetModel(
                control_layers_places=[0, 1],
                control_refiner_layers_places=[0],
                control_in_dim=2 * t.in_channels + 1 if inpaint else t.in_channels,
                all_patch_size=t.all_patch_size,
                all_f_patch_size=t.all_f_patch_size,
                dim=t.dim,
                n_refiner_layers=t.n_refiner_layers,
                n_heads=t.n_heads,
                n_kv_heads=t.n_kv_heads,
                norm_eps=t.norm_eps,
                qk_norm=t.qk_norm,
            ),
        )
        controlnet = diffusers.ZImageControlNetModel.from_transformer(controlnet, pipe.transformer)
        call = dict(call, control_image=test_image(seed=5), controlnet_conditioning_scale=0.7)
        if inpaint:
            call.update(image=[test_image(seed=4)] * 2, mask_image=[test_mask()] * 2)
        return fit(cls_name, dict(pipe.components, controlnet=controlnet), call)
    raise ValueError(f"no variant recipe for {cls_name}")


def marigold(seed: int = 0, cls_name: str = "MarigoldDepthPipeline"):
    """Marigold depth / normals: SD 1.5's parts with a UNet reading the image's latents beside the noise, an empty
    prompt, one DDIM ensemble member; intrinsics: two targets (8 latent channels out) denoised together."""
    intrinsics = "Intrinsics" in cls_name
    parts = _sd(seed, in_channels=12, out_channels=8) if intrinsics else _sd(seed, in_channels=8)
    parts.update(
        scheduler=diffusers.DDIMScheduler(
            beta_schedule="scaled_linear",
            beta_start=0.00085,
            beta_end=0.012,
            clip_sample=False,
            set_alpha_to_one=False,
            steps_offset=1,
            prediction_type="v_prediction",
            timestep_spacing="trailing",
        ),
        prediction_type="depth" if "Depth" in cls_name else "intrinsics" if intrinsics else "normals",
        target_properties={"target_names": ["albedo", "shading"]},
        default_denoising_steps=2,
        default_processing_resolution=32,
    )
    call = dict(
        image=[test_image(), test_image(seed=seed + 1)],
        num_inference_steps=2,
        ensemble_size=1,
        processing_resolution=32,
        match_input_resolution=True,
        batch_size=2,
    )
    return fit(cls_name, parts, call)


def flux_kontext_inpaint(seed: int = 0):
    parts, call = _flux_parts(seed)
    return fit(
        "FluxKontextInpaintPipeline",
        parts,
        dict(
            call,
            image=test_image(16, 16),
            mask_image=test_mask(16, 16),
            strength=0.8,
            _auto_resize=False,
            max_area=16 * 16,
        ),
    )


def dit(seed: int = 0):
    """DiT: class-conditional, two labels, CFG."""
    transformer = seeded(
        seed,
        lambda: DiTTransformer2DModel(
            sample_size=16,
            num_layers=2,
            patch_size=2,
            attention_head_dim=8,
            num_attention_heads=4,
            in_channels=4,
            out_channels=8,
            activation_fn="gelu-approximate",
            num_embeds_ada_norm=1000,
            norm_type="ada_norm_zero",
            norm_elementwise_affine=False,
        ),
    )
    pipe = DiTPipeline(transformer=transformer, vae=kl_vae(seed + 1), scheduler=diffusers.DPMSolverMultistepScheduler())
    return pipe, dict(class_labels=[1, 207], num_inference_steps=2, guidance_scale=4.0)


def sd_conditioned(seed: int = 0, cls_name: str = "StableDiffusionImageVariationPipeline"):
    """SD 1.5 conditioned otherwise: on a CLIP image embedding, with a T2I adapter, RGB-D output (LDM3D), the x4
    upscaler's noise-level class embedding."""
    parts = _sd(seed)
    call = dict(PROMPTS, height=32, width=32, num_inference_steps=2)
    if cls_name == "StableDiffusionImageVariationPipeline":
        parts.update(
            image_encoder=seeded(
                seed + 3,
                lambda: CLIPVisionModelWithProjection(CLIPVisionConfig(**dict(CLIP_VISION, projection_dim=32))),
            ),
            feature_extractor=clip_image_processor(),
        )
        call = dict(image=test_image(), height=32, width=32, num_inference_steps=2, guidance_scale=3.0)
    elif cls_name == "StableDiffusionAdapterPipeline":
        parts["adapter"] = seeded(
            seed + 3,
            lambda: diffusers.T2IAdapter(in_channels=3, channels=[8, 16], num_res_blocks=2, downscale_factor=2),
        )
        call.update(image=[test_image(seed=seed + 5), test_image(seed=seed + 6)])  # one per prompt
    elif cls_name == "StableDiffusionLDM3DPipeline":
        parts["image_encoder"] = None
        parts["vae"] = rebuilt(seed + 1, parts["vae"], in_channels=4, out_channels=4)  # RGB and depth
    elif cls_name == "StableDiffusionUpscalePipeline":
        parts["unet"] = rebuilt(seed, parts["unet"], in_channels=7, num_class_embeds=1000)  # latents + low-res RGB
        parts["low_res_scheduler"] = diffusers.DDPMScheduler()
        parts["vae"] = rebuilt(seed + 1, parts["vae"], scaling_factor=0.08333)
        call = dict(
            PROMPTS, image=[test_image(16, 16), test_image(16, 16, seed + 1)], num_inference_steps=2, noise_level=20
        )
    return fit(cls_name, parts, call)
