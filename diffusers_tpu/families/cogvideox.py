"""CogVideoX (1.0 and 1.5) text-to-video: sharding rules, chunked VAE decode, frame-count check, stage decode.

Attention: ``CogVideoXAttnProcessor2_0`` joins text and video tokens and calls ``F.scaled_dot_product_attention``
itself, so the SDPA route (``diffusers_tpu.attention``) serves it; its rotary embedding runs through the kernel
(``cogvideox_attention``). The pipeline already runs the CFG
pair as one batch (``torch.cat([latents] * 2)``), which the runtime shards over ``dp``.

VAE: the stock decode loops over latent-frame chunks, carrying a conv cache. Compiling ``vae.decoder.forward``
(not the whole decode) gives exactly two programs — the first chunk (no cache) and every later chunk — for any
frame count.
"""

from __future__ import annotations

import logging

import diffusers

from ..runtime.registry import Family, Planning, register, zero_text_call
from . import cogvideox_attention

logger = logging.getLogger(__name__)
_BLOCK = r"^transformer_blocks\.\d+\."
SHARD_RULES = (
    (_BLOCK + r"attn1\.(to_q|to_k|to_v)\.weight$", ("tp", None)),
    (_BLOCK + r"attn1\.(to_q|to_k|to_v)\.bias$", ("tp",)),
    (_BLOCK + r"attn1\.to_out\.0\.weight$", (None, "tp")),
    (_BLOCK + r"ff\.net\.0\.proj\.weight$", ("tp", None)),
    (_BLOCK + r"ff\.net\.0\.proj\.bias$", ("tp",)),
    (_BLOCK + r"ff\.net\.2\.weight$", (None, "tp")),
)
ACTIVATION_RULES = ((r"^transformer_blocks\.\d+$", ("dp", "sp", None)),)

# Real-size transformer architectures, buildable on the meta device.
_COGVIDEOX = dict(
    attention_head_dim=64,
    in_channels=16,
    out_channels=16,
    time_embed_dim=512,
    text_embed_dim=4096,
    patch_size=2,
    temporal_compression_ratio=4,
    max_text_seq_length=226,
)
COGVIDEOX_2B = dict(
    _COGVIDEOX, num_attention_heads=30, num_layers=30, sample_width=90, sample_height=60, sample_frames=49
)
COGVIDEOX_5B = dict(COGVIDEOX_2B, num_attention_heads=48, num_layers=42, use_rotary_positional_embeddings=True)
COGVIDEOX15_5B = dict(
    COGVIDEOX_5B, sample_width=170, sample_height=96, sample_frames=81, patch_size_t=2, patch_bias=False
)


def latent_frames(pipe, num_frames: int) -> int:
    return (num_frames - 1) // pipe.vae_scale_factor_temporal + 1


def decoded_frames(pipe, num_frames: int) -> int:
    """How many frames stock CogVideoX returns for ``num_frames``: its VAE decodes ``n`` latent frames into
    ``4n - 3`` frames when ``n`` is odd and ``4n`` when it is even (measured against stock, diffusers 0.42)."""
    latents, stride = latent_frames(pipe, num_frames), pipe.vae_scale_factor_temporal
    return stride * latents if latents % 2 == 0 else stride * (latents - 1) + 1


def note_frames(pipe, num_frames: int | None, output_type: str = "np") -> None:
    """A count stock returns more or fewer frames for runs as in stock (same frames); the log says so once, since
    stock does not."""
    if output_type == "latent":
        return
    num_frames = num_frames or pipe.transformer.config.sample_frames
    decoded = decoded_frames(pipe, num_frames)
    if decoded != num_frames and (num_frames, decoded) not in _NOTED:
        _NOTED.add((num_frames, decoded))
        period = 2 * pipe.vae_scale_factor_temporal
        below = (num_frames - 1) // period * period + 1
        logger.warning(
            "num_frames=%d: CogVideoX (stock and here alike) returns %d frames for it; %d or %d frames come out as "
            "asked.",
            num_frames,
            decoded,
            below,
            below + period,
        )


_NOTED: set = set()


def _check_call(pipe, kwargs) -> None:
    note_frames(pipe, kwargs.get("num_frames"), kwargs.get("output_type", "np"))
    # stock makes the latents in the prompt embeddings' dtype and hands them to the denoiser (and the VAE) uncast
    embeds, encoder = kwargs.get("prompt_embeds"), pipe.text_encoder
    latents = embeds.dtype if embeds is not None else encoder.dtype if encoder is not None else None
    if latents is not None and latents != pipe.transformer.dtype:
        raise ValueError(
            f"CogVideoXPipeline makes its latents in the text embeddings' dtype ({latents}) and passes them to the "
            f"denoiser uncast, whose weights are {pipe.transformer.dtype}: the first step would fail. Cast the whole "
            f"pipeline instead (from_pretrained(..., torch_dtype={pipe.transformer.dtype}) or "
            f"pipe.to({pipe.transformer.dtype}) before the move) and leave TPUConfig(dtype=...) unset."
        )


def forward_flops(config, latent_frames_: int, latent_height: int, latent_width: int, text_tokens: int) -> int:
    """Matmul FLOPs (2 per multiply-add) of one transformer forward for one sample. Text and video tokens attend
    jointly: per block, q/k/v/out projections 8*T*d^2, scores/values 4*T^2*d and the MLP 4*T*d*ffn over all
    T = text + video tokens; plus patch and text embedding and the output head."""
    p, p_t = config.patch_size, config.patch_size_t or 1
    frames = -(-latent_frames_ // p_t)
    video = frames * (latent_height // p) * (latent_width // p)
    total = video + text_tokens
    dim = config.num_attention_heads * config.attention_head_dim
    ffn = 4 * dim  # CogVideoXBlock's FeedForward default inner dim
    block = 8 * total * dim**2 + 4 * total**2 * dim + 4 * total * dim * ffn
    patch = p * p * p_t * config.in_channels
    edges = 2 * video * patch * dim + 2 * text_tokens * config.text_embed_dim * dim
    edges += 2 * video * dim * patch // config.in_channels * config.out_channels
    return config.num_layers * block + edges


def decode_latents(pipe, latents, num_frames: int):
    """Stock ``__call__``'s tail after the denoising loop (diffusers 0.42, pipeline_cogvideox.py): drop the frames
    added to fill the last temporal patch, then decode."""
    patch_t = pipe.transformer.config.patch_size_t
    frames = latent_frames(pipe, num_frames)
    additional = patch_t - frames % patch_t if patch_t is not None and frames % patch_t else 0
    return pipe.decode_latents(latents[:, additional:])


class CogVideoXPipeline(diffusers.CogVideoXPipeline):
    """The stock ``diffusers.CogVideoXPipeline``, importable from ``diffusers_tpu``.

    After ``import diffusers_tpu`` the stock class itself accepts ``pipe.to("tpu")`` / ``pipe.to("jax")`` too.
    """


FAMILY = register(
    Family(
        name="cogvideox",
        pipelines=(diffusers.CogVideoXPipeline,),
        denoisers=("transformer",),
        shard_rules=SHARD_RULES,
        activation_rules=ACTIVATION_RULES,
        vae_methods=("decoder.forward",),
        check_call=_check_call,
        decode_latents=decode_latents,
        prepare=lambda pipe, runtime: cogvideox_attention.install(runtime, pipe.transformer),
        planning=Planning(
            forward_flops=lambda pipe, h, w, f, text: forward_flops(
                pipe.transformer.config,
                latent_frames(pipe, f),
                h // pipe.vae_scale_factor_spatial,
                w // pipe.vae_scale_factor_spatial,
                text,
            ),
            call=zero_text_call(lambda pipe: pipe.transformer.config.text_embed_dim),
        ),
    )
)
