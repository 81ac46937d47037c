"""``CausalWanPipeline``: block-autoregressive (streaming) text-to-video with ``CausalWanTransformer3DModel``.

The recipe of Self-Forcing / CausVid / Matrix-Game-2 inference: the video is made ``num_frame_per_block`` latent
frames at a time. Each block starts from noise and is denoised in a few steps (``denoising_steps``, e.g. timesteps
1000, 666, 333, warped by the scheduler's shift) attending to itself and to the KV cache of earlier blocks; each
step predicts the clean block and re-noises it to the next level (``FlowMatchLCMScheduler``'s step). Then the
model runs once more on the clean block at the small timestep ``context_noise`` and that pass writes the block's
keys/values into the cache (``refresh_cache=False``: the last denoising step writes them instead, one forward
fewer per block). Each block is decoded at once, the VAE's causal feature cache carried across blocks
(``wan_vae.StreamingDecoder``), so ``pipe.stream(...)`` yields frames while later blocks are still to come and
``pipe(...)`` returns the whole video.

Every shape is the same from block to block and the block position is a tensor: on JAX (``pipe.to("tpu")``) one
compiled program per transformer pass serves every block, and no block after the first compiles anything.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import time
from collections.abc import Callable, Iterator

import diffusers
import numpy as np
import torch
from diffusers import AutoencoderKLWan, DiffusionPipeline, FlowMatchLCMScheduler
from diffusers.pipelines.wan.pipeline_output import WanPipelineOutput
from diffusers.utils.torch_utils import randn_tensor
from diffusers.video_processor import VideoProcessor

from ..interop import backend, user_tensors
from ..interop.compile_accounting import compile_log
from ..runtime.attach import pipeline_runtime
from ..runtime.registry import Family, Planning, register
from . import wan, wan_vae
from .causal_wan import CausalWanTransformer3DModel

OUTPUT_TYPES = ("np", "pil", "pt", "latent")


@dataclasses.dataclass
class BlockTiming:
    """One block of the last call. ``seconds``: from the block's first noise to its frames on the host;
    ``forward_seconds``: each transformer pass, synchronized (only with ``timing=True``)."""

    index: int
    frames: int
    seconds: float = 0.0
    compilations: int = 0
    forward_seconds: list[float] = dataclasses.field(default_factory=list)


class CausalWanPipeline(DiffusionPipeline):
    """Block-autoregressive Wan text-to-video (see the module docstring). Components as ``WanPipeline``'s, with a
    ``CausalWanTransformer3DModel`` and a ``FlowMatchLCMScheduler`` (its step is the few-step re-noising update):

        transformer = CausalWanTransformer3DModel.from_pretrained(path, subfolder="transformer", num_frame_per_block=3)
        pipe = CausalWanPipeline.from_pretrained(path, transformer=transformer,
                                                 scheduler=FlowMatchLCMScheduler(shift=5.0))
        for frames in pipe.stream(prompt, num_blocks=7): ...

    Per-block conditioning: ``block_inputs(index) -> dict`` adds or replaces transformer keyword arguments for
    block ``index`` (another prompt's ``encoder_hidden_states``, or the inputs of a transformer subclass with
    action modules); the default inputs come from ``prepare_block_inputs``, which subclasses may override.
    """

    model_cpu_offload_seq = "text_encoder->transformer->vae"

    def __init__(
        self,
        tokenizer,
        text_encoder,
        transformer: CausalWanTransformer3DModel,
        vae: AutoencoderKLWan,
        scheduler: FlowMatchLCMScheduler,
    ):
        super().__init__()
        self.register_modules(
            tokenizer=tokenizer, text_encoder=text_encoder, transformer=transformer, vae=vae, scheduler=scheduler
        )
        self.vae_scale_factor_temporal = vae.config.scale_factor_temporal if vae is not None else 4
        self.vae_scale_factor_spatial = vae.config.scale_factor_spatial if vae is not None else 8
        self.video_processor = VideoProcessor(vae_scale_factor=self.vae_scale_factor_spatial)
        self.block_timings: list[BlockTiming] = []

    # Text: exactly the stock Wan pipeline's (UMT5, prompts cleaned and padded to max_sequence_length).
    _get_t5_prompt_embeds = diffusers.WanPipeline._get_t5_prompt_embeds
    encode_prompt = diffusers.WanPipeline.encode_prompt

    def check_inputs(
        self,
        prompt=None,
        num_blocks=3,
        height=480,
        width=832,
        denoising_steps=(1000, 666, 333),
        context_noise=0.0,
        prompt_embeds=None,
        output_type="np",
        block_inputs=None,
        **_,
    ):
        """Every argument checked before anything runs; each error names the fix."""
        if not isinstance(self.transformer, CausalWanTransformer3DModel):
            raise ValueError(
                f"transformer is a {type(self.transformer).__name__}; CausalWanPipeline needs a "
                "CausalWanTransformer3DModel (CausalWanTransformer3DModel.from_transformer(wan) or "
                ".from_pretrained(wan_checkpoint, subfolder='transformer'))."
            )
        if not isinstance(self.scheduler, FlowMatchLCMScheduler):
            raise ValueError(
                f"scheduler is a {type(self.scheduler).__name__}; the few-step block schedule needs "
                "FlowMatchLCMScheduler: pass scheduler=diffusers.FlowMatchLCMScheduler(shift=5.0)."
            )
        if (prompt is None) == (prompt_embeds is None):
            raise ValueError("Pass exactly one of prompt (a string or a list of strings) and prompt_embeds.")
        if prompt is not None and not (
            isinstance(prompt, str) or isinstance(prompt, list) and all(isinstance(p, str) for p in prompt)
        ):
            raise ValueError(f"prompt must be a string or a list of strings, got {type(prompt).__name__}.")
        if not isinstance(num_blocks, int) or num_blocks < 1:
            raise ValueError(f"num_blocks={num_blocks!r} must be a positive integer.")
        multiple = self.vae_scale_factor_spatial * self.transformer.config.patch_size[1]
        for name, value in (("height", height), ("width", width)):
            if not isinstance(value, int) or value <= 0 or value % multiple:
                raise ValueError(f"{name}={value!r} must be a positive multiple of {multiple} (VAE x patch size).")
        steps = list(denoising_steps)
        if not steps or any(not 0 < t <= 1000 for t in steps) or any(a <= b for a, b in zip(steps, steps[1:])):
            raise ValueError(
                f"denoising_steps={denoising_steps!r} must be decreasing timesteps in (0, 1000], e.g. (1000, 666, 333)."
            )
        if not 0 <= context_noise < 1000:
            raise ValueError(f"context_noise={context_noise!r} must be a timestep in [0, 1000).")
        frames = num_blocks * self.transformer.config.num_frame_per_block
        if frames > self.transformer.config.rope_max_seq_len:
            raise ValueError(
                f"num_blocks={num_blocks} makes {frames} latent frames, more than the transformer's "
                f"rope_max_seq_len={self.transformer.config.rope_max_seq_len} positions: use fewer blocks."
            )
        if output_type not in OUTPUT_TYPES:
            raise ValueError(f"output_type={output_type!r} must be one of {OUTPUT_TYPES}.")
        if block_inputs is not None and not callable(block_inputs):
            raise ValueError("block_inputs must be a callable: block index -> dict of transformer keyword arguments.")

    def prepare_block_inputs(self, index: int, prompt_embeds: torch.Tensor) -> dict:
        """Transformer keyword arguments of block ``index`` besides latents, timestep and cache."""
        return {"encoder_hidden_states": prompt_embeds}

    def _forward(self, timing: BlockTiming | None, latents, timestep, inputs: dict, cache, offset, write: bool):
        start = time.perf_counter()
        batch = latents.shape[0]
        out = self.transformer(
            latents.to(self.transformer.dtype),
            timestep.expand(batch),
            **inputs,
            kv_cache=cache,
            frame_offset=offset,
            write_cache=write,
        )
        if timing is not None:
            backend.synchronize(out)
            timing.forward_seconds.append(time.perf_counter() - start)
        return out

    def _denoise_block(self, index, inputs, cache, shape, generator, sigmas, context_noise, refresh, timing):
        device = self._execution_device
        offset = torch.tensor(index * shape[2], dtype=torch.int32)  # a tensor: one program for every block
        latents = randn_tensor(shape, generator=generator, device=device, dtype=torch.float32)
        # each block's loop starts from the same scheduler state (a copy: what a block's steps leave, e.g.
        # FlowMatchLCM's ``_init_size``, would make the next block's first step another program on JAX)
        scheduler = copy.deepcopy(self.scheduler)
        scheduler.set_timesteps(sigmas=sigmas, device=device)
        scheduler.set_begin_index(0)  # no timestep lookup (a host sync) in step()
        timesteps = scheduler.timesteps
        for i, t in enumerate(timesteps):
            write = not refresh and i == len(timesteps) - 1
            flow, written = self._forward(timing, latents, t, inputs, cache, offset, write)
            latents = scheduler.step(flow, t, latents, generator=generator, return_dict=False)[0]
            cache = written if write else cache
        if refresh:  # the clean block at the context timestep writes the cache
            context = torch.full((), float(context_noise), device=device)
            cache = self._forward(timing, latents, context, inputs, cache, offset, True)[1]
        return latents, cache

    def _to_pixels(self, decoder, latents):
        return decoder.decode(wan.unnormalize_latents(self.vae, latents.to(self.vae.dtype)))

    @torch.no_grad()
    def stream(
        self,
        prompt: str | list[str] | None = None,
        num_blocks: int = 3,
        height: int = 480,
        width: int = 832,
        denoising_steps=(1000, 666, 333),
        context_noise: float = 0.0,
        refresh_cache: bool = True,
        num_videos_per_prompt: int = 1,
        generator: torch.Generator | None = None,
        prompt_embeds: torch.Tensor | None = None,
        output_type: str = "np",
        max_sequence_length: int = 512,
        block_inputs: Callable[[int], dict] | None = None,
        timing: bool = False,
    ) -> Iterator:
        """Yields each block's frames as soon as they are decoded: "np" ``[B, frames, H, W, C]``, "pil" a list
        of frame lists per video, "pt" ``[B, frames, C, H, W]``, "latent" the block's latents. The first block
        has ``1 + 4 * (num_frame_per_block - 1)`` frames, later ones ``4 * num_frame_per_block``.
        ``self.block_timings`` fills in as blocks complete."""
        self.check_inputs(
            prompt, num_blocks, height, width, denoising_steps, context_noise, prompt_embeds, output_type, block_inputs
        )
        attached = pipeline_runtime.runtime_of(self)
        enter = attached.call_scope if attached is not None else contextlib.nullcontext
        config, device = self.transformer.config, self._execution_device
        self.block_timings = []
        with enter():
            prompt_embeds, _ = self.encode_prompt(
                prompt,
                do_classifier_free_guidance=False,
                num_videos_per_prompt=num_videos_per_prompt,
                prompt_embeds=prompt_embeds,
                max_sequence_length=max_sequence_length,
                device=device,
            )
            prompt_embeds = prompt_embeds.to(self.transformer.dtype)
            batch, per_block = prompt_embeds.shape[0], config.num_frame_per_block
            latent_h, latent_w = height // self.vae_scale_factor_spatial, width // self.vae_scale_factor_spatial
            tokens = (latent_h // config.patch_size[1]) * (latent_w // config.patch_size[2])
            cache = self.transformer.new_kv_cache(batch, tokens, max_frames=num_blocks * per_block, device=device)
        shape = (batch, config.in_channels, per_block, latent_h, latent_w)
        sigmas = [t / 1000 for t in denoising_steps]
        decoder = wan_vae.StreamingDecoder(self.vae) if output_type != "latent" else None
        with self.progress_bar(total=num_blocks) as bar:
            for index in range(num_blocks):
                pixel_frames = per_block * self.vae_scale_factor_temporal - (3 if index == 0 else 0)
                record = BlockTiming(index, pixel_frames if decoder else per_block)
                start = time.perf_counter()
                with enter(), compile_log() as log:
                    inputs = self.prepare_block_inputs(index, prompt_embeds)
                    inputs.update(block_inputs(index) if block_inputs is not None else {})
                    latents, cache = self._denoise_block(
                        index,
                        inputs,
                        cache,
                        shape,
                        generator,
                        sigmas,
                        context_noise,
                        refresh_cache,
                        record if timing else None,
                    )
                    if decoder is None:
                        frames = latents
                    else:
                        frames = self.video_processor.postprocess_video(self._to_pixels(decoder, latents), output_type)
                        if decoder.rehearsal is not None:  # later blocks' frame count: postprocess compiles now
                            self.video_processor.postprocess_video(decoder.rehearsal, output_type)
                            decoder.rehearsal = None
                    frames = user_tensors.to_host(frames)
                record.seconds, record.compilations = time.perf_counter() - start, log.compilations
                self.block_timings.append(record)
                bar.update()
                yield frames
        if attached is not None and not attached.inside_call():
            attached.recorded = None  # the progress bar's sync handle; it would pin the last cache

    @torch.no_grad()
    def __call__(
        self,
        prompt: str | list[str] | None = None,
        num_blocks: int = 3,
        height: int = 480,
        width: int = 832,
        denoising_steps=(1000, 666, 333),
        context_noise: float = 0.0,
        refresh_cache: bool = True,
        num_videos_per_prompt: int = 1,
        generator: torch.Generator | None = None,
        prompt_embeds: torch.Tensor | None = None,
        output_type: str = "np",
        max_sequence_length: int = 512,
        block_inputs: Callable[[int], dict] | None = None,
        timing: bool = False,
        return_dict: bool = True,
    ):
        """The whole video (all ``num_blocks`` blocks of ``stream``, concatenated), as ``WanPipeline`` returns it."""
        arguments = dict(locals())
        arguments.pop("self"), arguments.pop("return_dict")
        blocks = list(self.stream(**arguments))
        if output_type == "pil":
            video = [sum((block[i] for block in blocks), []) for i in range(len(blocks[0]))]
        elif output_type == "np":
            video = np.concatenate(blocks, axis=1)
        else:
            video = torch.cat(blocks, dim=2 if output_type == "latent" else 1)
        self.maybe_free_model_hooks()
        return WanPipelineOutput(frames=video) if return_dict else (video,)


def _check_call(pipe, arguments: dict) -> None:
    pipe.check_inputs(**{k: v for k, v in arguments.items() if k != "self"})


def _latent_frames(pipe, num_frames: int) -> int:
    """Latent frames of a ``num_frames`` video, rounded up to whole blocks."""
    per_block = pipe.transformer.config.num_frame_per_block
    latent = (num_frames - 1) // pipe.vae_scale_factor_temporal + 1
    return -(-latent // per_block) * per_block


def _plan_call(pipe, size: dict, text_tokens: int, dtype) -> dict:
    """``plan``: blocks enough for ``num_frames`` (no guidance: the few-step model runs unguided)."""
    embeddings = torch.zeros(1, text_tokens, pipe.transformer.config.text_dim, dtype=dtype)
    return dict(
        prompt_embeds=embeddings,
        height=size["height"],
        width=size["width"],
        max_sequence_length=text_tokens,
        num_blocks=_latent_frames(pipe, size["num_frames"]) // pipe.transformer.config.num_frame_per_block,
    )


def forward_flops(pipe, height: int, width: int, num_frames: int, text_tokens: int) -> int:
    """Matmul FLOPs of the costliest pass of a ``num_frames`` video: the last block (``wan.forward_flops``), its
    queries also attending to every earlier frame the cache keeps (Wan patches frames one by one)."""
    config, per_block = pipe.transformer.config, pipe.transformer.config.num_frame_per_block
    frames = _latent_frames(pipe, num_frames)
    latent_h, latent_w = height // pipe.vae_scale_factor_spatial, width // pipe.vae_scale_factor_spatial
    per_frame = (latent_h // config.patch_size[1]) * (latent_w // config.patch_size[2])
    cached = min(frames, pipe.transformer.cache_frames(frames)) - per_block
    dim = config.num_attention_heads * config.attention_head_dim
    return (
        wan.forward_flops(config, per_block, latent_h, latent_w, text_tokens)
        + config.num_layers * 4 * (per_block * per_frame) * (cached * per_frame) * dim
    )


FAMILY = register(
    Family(
        name="causal_wan",
        pipelines=(CausalWanPipeline,),
        denoisers=("transformer",),
        shard_rules=wan.SHARD_RULES,
        activation_rules=wan.ACTIVATION_RULES,
        vae_methods=(),
        vae_install=wan_vae.install,
        vae_programs=wan_vae.PROGRAMS,
        check_call=_check_call,
        planning=Planning(
            call=_plan_call,
            # the clean block's cache-writing pass is a second program (it returns the cache)
            passes=lambda kwargs: [dict(kwargs, write_cache=True)] if not kwargs.get("write_cache") else [],
            forward_flops=forward_flops,
        ),
    )
)
