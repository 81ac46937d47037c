"""Wan (2.1 and 2.2; text-to-video and image-to-video) and its wider family: sharding rules, CFG pairing, FLOPs.

The Wan architecture also serves ``WanVideoToVideoPipeline`` (its loop has no cache contexts: the CFG pairing infers
which call is which), ``WanVACEPipeline`` (the control ``vace_blocks`` are sharded like the main blocks) and
SkyReels-V2 (``SkyReelsV2Pipeline``; ``SkyReelsV2DiffusionForcingPipeline`` with per-frame timesteps and a
block-causal attention mask, which runs through the exact masked reference).

``WanPipeline`` covers Wan 2.1 T2V, Wan 2.2 A14B (``transformer_2`` switching at the boundary timestep) and TI2V-5B
(48-channel VAE, ``expand_timesteps``); ``WanImageToVideoPipeline`` adds a CLIP image encoder whose tokens join the
text in cross-attention. The VAE runs in compiled temporal chunks (``wan_vae``).

Megatron-style tensor parallelism over ``tp``: q/k/v and the first FFN projection are column-parallel (their
output features, i.e. whole heads, split over tp), the attention output and second FFN projection are
row-parallel (their input features split, XLA adds the all-reduce). The per-head-dim RMS norms of q and k
follow their columns. Everything else (embeddings, modulation tables, norms, the output head) is replicated.
Block inputs are constrained to (dp, sp): batch over dp, tokens over sp.
"""

from __future__ import annotations

import diffusers
import torch

from ..runtime.registry import CFGBatching, Family, Planning, register, zero_text_call
from . import wan_attention, wan_vae

_BLOCK = r"^(blocks|vace_blocks)\.\d+\."  # VACE's control blocks are Wan blocks too
SHARD_RULES = (
    (_BLOCK + r"attn[12]\.(to_q|to_k|to_v|add_k_proj|add_v_proj)\.weight$", ("tp", None)),
    (_BLOCK + r"attn[12]\.(to_q|to_k|to_v|add_k_proj|add_v_proj)\.bias$", ("tp",)),
    (_BLOCK + r"attn[12]\.(norm_q|norm_k|norm_added_k)\.weight$", ("tp",)),
    (_BLOCK + r"attn[12]\.to_out\.0\.weight$", (None, "tp")),
    (_BLOCK + r"ffn\.net\.0\.proj\.weight$", ("tp", None)),
    (_BLOCK + r"ffn\.net\.0\.proj\.bias$", ("tp",)),
    (_BLOCK + r"ffn\.net\.2\.weight$", (None, "tp")),
)
ACTIVATION_RULES = ((r"^(blocks|vace_blocks)\.\d+$", ("dp", "sp", None)),)

# Real-size transformer architectures (configs of the published checkpoints), buildable on the meta device.
_WAN21 = dict(
    patch_size=(1, 2, 2),
    attention_head_dim=128,
    in_channels=16,
    out_channels=16,
    text_dim=4096,
    freq_dim=256,
    cross_attn_norm=True,
    qk_norm="rms_norm_across_heads",
    eps=1e-6,
    rope_max_seq_len=1024,
)
WAN21_1_3B = dict(_WAN21, num_attention_heads=12, ffn_dim=8960, num_layers=30)
WAN21_14B = dict(_WAN21, num_attention_heads=40, ffn_dim=13824, num_layers=40)


def _denoiser(pipe):
    """The transformer the pipeline has (Wan 2.2 A14B may load only its low-noise ``transformer_2``)."""
    return pipe.transformer if pipe.transformer is not None else getattr(pipe, "transformer_2", None)


def _num_heads(pipe) -> int | None:
    model = _denoiser(pipe)
    return model.config.num_attention_heads if model is not None else None


def forward_flops(config, latent_frames: int, latent_height: int, latent_width: int, text_tokens: int) -> int:
    """Matmul FLOPs (2 per multiply-add) of one transformer forward for one sample: per block, self-attention
    projections 8*S*d^2 and scores/values 4*S^2*d, cross-attention (q and out over S, k and v over the text)
    4*S*d^2 + 4*L*d^2 + 4*S*L*d, the MLP 4*S*d*ffn; plus patch embedding, text embedding and output head.
    Norms, modulation and elementwise work are left out (a fraction of a percent at video sizes)."""
    p_t, p_h, p_w = config.patch_size
    tokens = (latent_frames // p_t) * (latent_height // p_h) * (latent_width // p_w)
    dim = config.num_attention_heads * config.attention_head_dim
    text = text_tokens
    block = (
        8 * tokens * dim**2
        + 4 * tokens**2 * dim
        + 4 * tokens * dim**2
        + 4 * text * dim**2
        + 4 * tokens * text * dim
        + 4 * tokens * dim * config.ffn_dim
    )
    patch = p_t * p_h * p_w * config.in_channels
    edges = 2 * tokens * patch * dim + 2 * tokens * dim * config.out_channels * p_t * p_h * p_w
    text_embedding = 2 * text * (config.text_dim * dim + dim * dim)
    return config.num_layers * block + edges + text_embedding


def latent_size(pipe, height: int, width: int, num_frames: int) -> tuple[int, int, int]:
    return (
        (num_frames - 1) // pipe.vae_scale_factor_temporal + 1,
        height // pipe.vae_scale_factor_spatial,
        width // pipe.vae_scale_factor_spatial,
    )


def check_frames(pipe, kwargs) -> None:
    """A temporal patch over 1 with a latent frame count it does not divide fails inside the first scheduler step
    in stock code (the transformer drops the leftover frames). Refuse it before anything compiles and name counts
    that work. (Height and width need no check: stock rounds them to whole patches itself, with a warning.)"""
    transformer = _denoiser(pipe)
    frames = kwargs.get("num_frames")
    if transformer is None or frames is None:
        return
    p_t = transformer.config.patch_size[0]
    stride = pipe.vae_scale_factor_temporal
    frames = frames // stride * stride + 1 if frames % stride != 1 else frames  # stock's own rounding
    latent_frames = (frames - 1) // stride + 1
    if latent_frames % p_t:
        below = max(1, latent_frames // p_t) * p_t
        raise ValueError(
            f"num_frames={kwargs['num_frames']} gives {latent_frames} latent frames, not a multiple of the "
            f"transformer's temporal patch ({p_t}). Use num_frames={(below - 1) * stride + 1} or "
            f"{(below + p_t - 1) * stride + 1}."
        )


def prepare(pipe, runtime) -> None:
    """After placement: self-attention's rotary embedding through the kernel (``wan_attention``)."""
    for name in ("transformer", "transformer_2"):
        wan_attention.install(runtime, getattr(pipe, name, None))


def unnormalize_latents(vae, latents):
    """Latents as the VAE decodes them, computed as the stock pipeline does (diffusers 0.42, pipeline_wan.py)."""
    shape = (1, vae.config.z_dim, 1, 1, 1)
    mean = torch.tensor(vae.config.latents_mean).view(shape).to(latents.device, latents.dtype)
    inverse_std = 1.0 / torch.tensor(vae.config.latents_std).view(shape).to(latents.device, latents.dtype)
    return latents / inverse_std + mean


def decode_latents(pipe, latents, num_frames: int):
    """Stock ``__call__``'s tail after the denoising loop: un-normalize the latents, then decode."""
    latents = latents.to(pipe._execution_device, dtype=pipe.vae.dtype)
    return pipe.vae.decode(unnormalize_latents(pipe.vae, latents), return_dict=False)[0]


class WanPipeline(diffusers.WanPipeline):
    """The stock ``diffusers.WanPipeline``, importable from ``diffusers_tpu`` (``from_pretrained`` works as usual).

    After ``import diffusers_tpu`` the stock class itself accepts ``pipe.to("tpu")`` / ``pipe.to("jax")`` too.
    """


class WanImageToVideoPipeline(diffusers.WanImageToVideoPipeline):
    """The stock ``diffusers.WanImageToVideoPipeline`` (Wan 2.1/2.2 image-to-video), importable from
    ``diffusers_tpu``."""


FAMILY = register(
    Family(
        name="wan",
        pipelines=(
            diffusers.WanPipeline,
            diffusers.WanImageToVideoPipeline,
            diffusers.WanVideoToVideoPipeline,
            diffusers.WanVACEPipeline,
            diffusers.SkyReelsV2Pipeline,
            diffusers.SkyReelsV2DiffusionForcingPipeline,
        ),
        denoisers=("transformer", "transformer_2"),
        shard_rules=SHARD_RULES,
        activation_rules=ACTIVATION_RULES,
        num_heads=_num_heads,
        vae_methods=(),
        vae_install=wan_vae.install,
        vae_programs=wan_vae.PROGRAMS,
        cfg=CFGBatching(
            negative=lambda encoded: encoded[1],
            batched_args=(
                "hidden_states",
                "timestep",
                "encoder_hidden_states",
                "encoder_hidden_states_image",
                "control_hidden_states",
                "fps",
            ),
            grouped_args=("encoder_hidden_states_image",),
        ),
        prepare=prepare,
        check_call=check_frames,
        decode_latents=decode_latents,
        planning=Planning(
            forward_flops=lambda pipe, h, w, f, text: forward_flops(
                pipe.transformer.config, *latent_size(pipe, h, w, f), text
            ),
            call=zero_text_call(lambda pipe: pipe.transformer.config.text_dim),
        ),
    )
)
