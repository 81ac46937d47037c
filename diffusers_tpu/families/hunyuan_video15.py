"""HunyuanVideo-1.5 text-to-video: text-padding key mask (never an S x S mask), jit-safe token reordering,
frame-causal VAE attention without the Python loop, sharding rules.

What stock diffusers 0.42 does that XLA cannot take, and what replaces it here (per instance, undone by
``pipe.to("cpu")``; stock classes untouched):

- ``HunyuanVideo15AttnProcessor2_0`` turns the per-token validity vector into a dense ``[B, 1, S, S]`` bool mask
  (about 13 GB per batch item at 720p). ``KeyMaskProcessor`` hands the vector to the kernel as its key mask
  (``[B, 1, 1, S]`` -> ``kv_mask``) and zeroes fully masked query rows, as torch does (the kernel alone would
  attend them over the valid keys; a plain softmax gives NaN there, which reaches every token from the second
  layer on). ``TPUConfig(text_padding="zero_kv")`` zeroes padded keys/values instead: an approximation. Its rotary
  embedding runs through ``runtime.rotary`` (the Pallas kernel on TPU: diffusers' pair layout made the TPU compiler
  copy q and k sequence-minor and back in every block).
- The transformer's ``forward`` branches on ``torch.all(image_embeds == 0)`` and compacts tokens with boolean
  indexing (``text[text_mask]``), which has no static shape. ``forward`` below replaces the branch with a
  multiplication by the image mask (bit-identical: ``x * 1.0 == x``) and the compaction with a gather along a
  stable argsort of the validity masks (valid tokens first, each group in order: exactly stock's order). The
  permutation depends only on the prompt: the ``family`` hook (``TokenOrder``) computes it once per prompt outside
  the compiled program and passes it in. Rotary tables depend only on shapes, so XLA folds them into constants.
- The VAE's ``prepare_causal_attention_mask`` fills an S x S mask row by row in Python (tens of thousands of
  traced ops); ``frame_causal_mask`` builds the same mask from two iotas.
- The scheduler looks its first step up with ``.item()`` (a host sync); the loop always starts at the first
  timestep, so its begin index is set to 0 after ``set_timesteps``.
"""

from __future__ import annotations

import functools
import weakref

import diffusers
import torch
import torch.nn.functional as F
from diffusers.models.autoencoders.autoencoder_kl_hunyuanvideo15 import HunyuanVideo15AttnBlock
from diffusers.models.modeling_outputs import Transformer2DModelOutput
from diffusers.models.transformers.transformer_hunyuan_video15 import HunyuanVideo15AttnProcessor2_0
from diffusers.utils import apply_lora_scale

from ..interop.backend import is_jax_tensor, jax_to_host, torch_mode
from ..runtime.attention import rotary
from ..runtime.call.hook_chain import Hook
from ..runtime.config import TEXT_PADDING_MODES
from ..runtime.registry import CFGBatching, Family, Planning, Staging, register

_BLOCK = r"^transformer_blocks\.\d+\."
# Megatron-style tp over whole heads (see wan.py); the per-head-dim q/k RMS norms are shared by all heads.
SHARD_RULES = (
    (_BLOCK + r"attn\.(to_q|to_k|to_v|add_q_proj|add_k_proj|add_v_proj)\.weight$", ("tp", None)),
    (_BLOCK + r"attn\.(to_q|to_k|to_v|add_q_proj|add_k_proj|add_v_proj)\.bias$", ("tp",)),
    (_BLOCK + r"attn\.(to_out\.0|to_add_out)\.weight$", (None, "tp")),
    (_BLOCK + r"(ff|ff_context)\.net\.0\.proj\.weight$", ("tp", None)),
    (_BLOCK + r"(ff|ff_context)\.net\.0\.proj\.bias$", ("tp",)),
    (_BLOCK + r"(ff|ff_context)\.net\.2\.weight$", (None, "tp")),
)
ACTIVATION_RULES = ((r"^transformer_blocks\.\d+$", ("dp", "sp", None)),)

# Real-size transformer (the published 480p/720p T2V checkpoints), buildable on the meta device.
HUNYUANVIDEO15_8B = dict(
    in_channels=65,
    out_channels=32,
    num_attention_heads=16,
    attention_head_dim=128,
    num_layers=54,
    num_refiner_layers=2,
    text_embed_dim=3584,
    text_embed_2_dim=1472,
    image_embed_dim=1152,
    rope_axes_dim=(16, 56, 56),
    task_type="t2v",
)


class KeyMaskProcessor(HunyuanVideo15AttnProcessor2_0):
    """The stock joint attention with the text padding as a key mask (no ``[B, 1, S, S]`` tensor).

    ``Attention.forward`` passes keywords by the processor's ``__call__`` signature: keep the stock names."""

    def __init__(self, text_padding: str = "mask"):
        super().__init__()
        if text_padding not in TEXT_PADDING_MODES:
            raise ValueError(f"text_padding={text_padding!r}; choose one of {list(TEXT_PADDING_MODES)}.")
        self.text_padding = text_padding

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, image_rotary_emb=None):
        query, key, value = (attn.to_q(hidden_states), attn.to_k(hidden_states), attn.to_v(hidden_states))
        query, key, value = (x.unflatten(2, (attn.heads, -1)) for x in (query, key, value))
        query, key = attn.norm_q(query), attn.norm_k(key)
        if image_rotary_emb is not None:  # stock's ``apply_rotary_emb(x, freqs, sequence_dim=1)``, through the kernel
            freqs_cos, freqs_sin = image_rotary_emb
            query, key = rotary.rotate(query, key, freqs_cos=freqs_cos, freqs_sin=freqs_sin, tables="lanes")
        if encoder_hidden_states is not None:
            extra = [
                attn.add_q_proj(encoder_hidden_states),
                attn.add_k_proj(encoder_hidden_states),
                attn.add_v_proj(encoder_hidden_states),
            ]
            extra = [x.unflatten(2, (attn.heads, -1)) for x in extra]
            if attn.norm_added_q is not None:
                extra[0] = attn.norm_added_q(extra[0])
            if attn.norm_added_k is not None:
                extra[1] = attn.norm_added_k(extra[1])
            query, key, value = (torch.cat([x, e], dim=1) for x, e in zip((query, key, value), extra))

        batch, seq_len = query.shape[:2]
        valid = F.pad(attention_mask, (seq_len - attention_mask.shape[1], 0), value=True).bool()  # [B, S]
        query, key, value = (x.transpose(1, 2) for x in (query, key, value))  # [B, H, S, D]
        if self.text_padding == "mask":
            out = F.scaled_dot_product_attention(query, key, value, attn_mask=valid[:, None, None, :])
        else:
            keep = valid[:, None, :, None].to(key.dtype)
            out = F.scaled_dot_product_attention(query, key * keep, value * keep)
        # a query with no visible key: 0, as torch's masked SDPA gives (stock's mask hides padded rows too)
        out = out * valid[:, None, :, None].to(out.dtype)
        hidden_states = out.transpose(1, 2).flatten(2, 3).to(query.dtype)

        if encoder_hidden_states is not None:
            text_len = encoder_hidden_states.shape[1]
            hidden_states, encoder_hidden_states = hidden_states[:, :-text_len], hidden_states[:, -text_len:]
            if getattr(attn, "to_out", None) is not None:
                hidden_states = attn.to_out[1](attn.to_out[0](hidden_states))
            if getattr(attn, "to_add_out", None) is not None:
                encoder_hidden_states = attn.to_add_out(encoder_hidden_states)
        return hidden_states, encoder_hidden_states


def text_token_order(encoder_attention_mask, encoder_attention_mask_2, image_embeds):
    """The permutation stock's boolean compaction applies to ``[image, byt5, mllm]`` tokens: valid tokens first,
    then padding, each group in its original order (a stable argsort), ``[B, L]``; and the image-token mask."""
    batch, image_tokens = image_embeds.shape[:2]
    has_image = torch.any(image_embeds != 0)  # stock: t2v when every image embedding is 0
    image_mask = has_image.expand(batch, image_tokens)
    valid = torch.cat([image_mask, encoder_attention_mask_2.bool(), encoder_attention_mask.bool()], dim=1)
    return torch.argsort((~valid).to(torch.int32), dim=1, stable=True), image_mask


def _gather_tokens(tokens, order):
    return torch.gather(tokens, 1, order.unsqueeze(-1).expand(-1, -1, tokens.shape[-1]))


@apply_lora_scale("attention_kwargs")
def forward(
    self,
    hidden_states,
    timestep,
    encoder_hidden_states,
    encoder_attention_mask,
    timestep_r=None,
    encoder_hidden_states_2=None,
    encoder_attention_mask_2=None,
    image_embeds=None,
    attention_kwargs=None,
    return_dict=True,
    token_order=None,
):
    """``HunyuanVideo15Transformer3DModel.forward`` (diffusers 0.42) with static shapes: no data-dependent branch,
    no boolean indexing. ``token_order``: ``text_token_order``'s permutation, computed here when not given."""
    batch, _, frames, height, width = hidden_states.shape
    p_t, p = self.config.patch_size_t, self.config.patch_size
    image_rotary_emb = self.rope(hidden_states)
    temb = self.time_embed(timestep, timestep_r=timestep_r)
    hidden_states = self.x_embedder(hidden_states)

    text = self.context_embedder(encoder_hidden_states, timestep, encoder_attention_mask)
    text = text + self.cond_type_embed(torch.zeros_like(text[:, :, 0], dtype=torch.long))
    text_2 = self.context_embedder_2(encoder_hidden_states_2)
    text_2 = text_2 + self.cond_type_embed(torch.ones_like(text_2[:, :, 0], dtype=torch.long))
    order, image_mask = text_token_order(encoder_attention_mask, encoder_attention_mask_2, image_embeds)
    order = order if token_order is None else token_order
    image = self.image_embedder(image_embeds)
    image = image * image_mask.unsqueeze(-1).to(image.dtype)  # stock: `* 0.0` for t2v, untouched otherwise
    image = image + self.cond_type_embed(2 * torch.ones_like(image[:, :, 0], dtype=torch.long))

    mask, mask_2 = encoder_attention_mask.bool(), encoder_attention_mask_2.bool()
    tokens = torch.cat(
        [
            image,
            torch.where(mask_2.unsqueeze(-1), text_2, 0.0),  # padded text is zeroed, as stock
            torch.where(mask.unsqueeze(-1), text, 0.0),
        ],
        dim=1,
    )
    valid = torch.cat([image_mask, mask_2, mask], dim=1)
    encoder_hidden_states = _gather_tokens(tokens, order)
    encoder_attention_mask = torch.gather(valid, 1, order)

    for block in self.transformer_blocks:
        hidden_states, encoder_hidden_states = block(
            hidden_states, encoder_hidden_states, temb, encoder_attention_mask, image_rotary_emb
        )

    hidden_states = self.proj_out(self.norm_out(hidden_states, temb))
    hidden_states = hidden_states.reshape(batch, frames // p_t, height // p, width // p, -1, p_t, p, p)
    hidden_states = hidden_states.permute(0, 4, 1, 5, 2, 6, 3, 7).flatten(6, 7).flatten(4, 5).flatten(2, 3)
    return Transformer2DModelOutput(sample=hidden_states) if return_dict else (hidden_states,)


class _PromptMemo:
    """The token order of the last prompts, keyed by the identity of their mask tensors (the pipeline passes
    the same tensors at every step)."""

    def __init__(self, size: int = 4):
        self.size, self.entries = size, []

    def get(self, tensors, compute):
        for refs, value in self.entries:
            if all(ref() is t for ref, t in zip(refs, tensors)):
                return value
        value = compute(*tensors)
        self.entries = [([weakref.ref(t) for t in tensors], value)] + self.entries[: self.size - 1]
        return value


def _token_order_on_host(*tensors):
    """``text_token_order`` in torch on the host (once per prompt): as eager device ops it was three one-off programs
    of a first call. The compiled forward takes the host permutation as an input."""
    host = [jax_to_host(t.jax()) if is_jax_tensor(t) else t for t in tensors]
    with torch_mode():
        return text_token_order(*host)


class TokenOrder(Hook):
    """The transformer's ``family`` hook: the token permutation computed once per prompt, outside the compiled
    forward, which takes it as ``token_order``."""

    name = "family"

    def __init__(self):
        self.memo = _PromptMemo()

    def pre_call(self, call) -> None:
        kwargs = call.kwargs
        masks = (
            kwargs.get("encoder_attention_mask"),
            kwargs.get("encoder_attention_mask_2"),
            kwargs.get("image_embeds"),
        )
        if call.args or any(m is None for m in masks) or "token_order" in kwargs:
            return
        order, _ = self.memo.get(masks, _token_order_on_host)
        call.kwargs = dict(kwargs, token_order=order)


def frame_causal_mask(n_frame: int, n_hw: int, dtype, device, batch_size: int | None = None):
    """``HunyuanVideo15AttnBlock.prepare_causal_attention_mask``, vectorized: a token sees every token of its
    own and earlier frames (0), nothing later (-inf). Returned as ``[S, S]`` whatever ``batch_size``: stock's
    ``[B, S, S]`` meets queries ``[B, 1, S, D]`` in SDPA and broadcasts to ``[B, B, S, S]`` (an error for B > 1
    in diffusers 0.42); ``[S, S]`` broadcasts over any batch."""
    frame = torch.arange(n_frame * n_hw, device=device) // n_hw
    visible = frame[None, :] <= frame[:, None]
    return torch.zeros(visible.shape, dtype=dtype, device=device).masked_fill(~visible, float("-inf"))


def _prepare(pipe, runtime) -> None:
    transformer = pipe.transformer
    processor = KeyMaskProcessor(runtime.config.text_padding)
    for module in transformer.modules():
        if isinstance(getattr(module, "processor", None), HunyuanVideo15AttnProcessor2_0):
            runtime.overrides.set(module, "processor", processor)
    runtime.chain(transformer).register(TokenOrder())
    for module in pipe.vae.modules():
        if isinstance(module, HunyuanVideo15AttnBlock):
            runtime.overrides.set(module, "prepare_causal_attention_mask", frame_causal_mask)
    scheduler = pipe.scheduler
    if hasattr(scheduler, "set_begin_index"):
        runtime.overrides.set(scheduler, "set_timesteps", _from_first_timestep(scheduler, scheduler.set_timesteps))


def _from_first_timestep(scheduler, set_timesteps):
    """``set_timesteps`` then ``set_begin_index(0)``: the stock loop starts at the first timestep, and without a
    begin index the first ``step`` finds its index with a host sync (``.item()``)."""

    @functools.wraps(set_timesteps)
    def wrapped(*args, **kwargs):
        out = set_timesteps(*args, **kwargs)
        scheduler.set_begin_index(0)
        return out

    return wrapped


def forward_flops(config, latent_frames: int, latent_height: int, latent_width: int, text_tokens: int) -> int:
    """Matmul FLOPs of one transformer forward for one sample: joint attention over video + text tokens
    (q/k/v/out 8*T*d^2, scores/values 4*T^2*d) and both MLP streams (4*T*d*ffn), plus the patch embedding and the
    output head. The token refiner (2 small layers over the text) is left out."""
    video = (
        (latent_frames // config.patch_size_t)
        * (latent_height // config.patch_size)
        * (latent_width // config.patch_size)
    )
    total = video + text_tokens
    dim = config.num_attention_heads * config.attention_head_dim
    ffn = int(dim * config.mlp_ratio)
    block = 8 * total * dim**2 + 4 * total**2 * dim + 4 * total * dim * ffn
    patch = config.patch_size_t * config.patch_size**2
    edges = 2 * video * patch * config.in_channels * dim + 2 * video * dim * patch * config.out_channels
    return config.num_layers * block + edges


_TEXT = ("prompt_embeds", "prompt_embeds_mask", "prompt_embeds_2", "prompt_embeds_mask_2")


def _guider(pipe, guidance_scale):
    return pipe.guider if guidance_scale is None else pipe.guider.new(guidance_scale=guidance_scale)


def stage_encode(pipe, prompt, negative_prompt, guidance_scale, max_sequence_length) -> dict:
    """Staged runs: stock ``__call__``'s text encoding (diffusers 0.42): the prompt, and the negative prompt when the
    guider runs a second condition."""
    batch = 1 if isinstance(prompt, str) else len(prompt)
    common = dict(device=pipe._execution_device, dtype=pipe.transformer.dtype, batch_size=batch)
    tensors = dict(zip(_TEXT, pipe.encode_prompt(prompt=prompt, **common)))
    guider = _guider(pipe, guidance_scale)
    if guider._enabled and guider.num_conditions > 1:
        negative = pipe.encode_prompt(prompt=negative_prompt, **common)
        tensors.update({f"negative_{name}": value for name, value in zip(_TEXT, negative)})
    return tensors


def stage_inputs(pipe, tensors, guidance_scale) -> dict:
    """Staged runs: saved text tensors as ``__call__`` keywords; the guidance scale goes to the guider."""
    pipe.guider = _guider(pipe, guidance_scale)
    return dict(tensors)


def plan_call(pipe, size: dict, text_tokens: int, dtype) -> dict:
    """``plan``: the call with zero text embeddings of the pipeline's own lengths (its ``tokenizer_max_length`` MLLM
    and ``tokenizer_2_max_length`` ByT5 tokens; ``text_tokens`` does not apply), all valid. The guidance scale
    goes to the guider (``plan`` sets it)."""
    config = pipe.transformer.config
    texts = {}
    for suffix, tokens, width in (
        ("", pipe.tokenizer_max_length, config.text_embed_dim),
        ("_2", pipe.tokenizer_2_max_length, config.text_embed_2_dim),
    ):
        for prefix in ("", "negative_"):
            texts[f"{prefix}prompt_embeds{suffix}"] = torch.zeros(1, tokens, width, dtype=dtype)
            texts[f"{prefix}prompt_embeds_mask{suffix}"] = torch.ones(1, tokens, dtype=dtype)
    return dict(texts, height=size["height"], width=size["width"], num_frames=size["num_frames"], num_inference_steps=2)


def decode_latents(pipe, latents, num_frames: int):
    """Stock ``__call__``'s tail after the loop (diffusers 0.42): unscale, decode."""
    latents = latents.to(pipe.vae.dtype) / pipe.vae.config.scaling_factor
    return pipe.vae.decode(latents, return_dict=False)[0]


class HunyuanVideo15Pipeline(diffusers.HunyuanVideo15Pipeline):
    """The stock ``diffusers.HunyuanVideo15Pipeline``, importable from ``diffusers_tpu``.

    After ``import diffusers_tpu`` the stock class itself accepts ``pipe.to("tpu")`` / ``pipe.to("jax")`` too.
    """


def _text_tokens(pipe) -> int:
    return pipe.tokenizer_max_length + pipe.tokenizer_2_max_length + pipe.vision_num_semantic_tokens


FAMILY = register(
    Family(
        name="hunyuanvideo15",
        pipelines=(diffusers.HunyuanVideo15Pipeline, diffusers.HunyuanVideo15ImageToVideoPipeline),
        denoisers=("transformer",),
        shard_rules=SHARD_RULES,
        activation_rules=ACTIVATION_RULES,
        denoiser_forward=forward,
        prepare=_prepare,
        tpu_dtypes={"text_encoder_2": torch.bfloat16},
        # the guider's "pred_cond" / "pred_uncond" passes as one batch; the negative text comes from a second
        # encode_prompt call: (embeddings, mask, ByT5 embeddings, ByT5 mask)
        cfg=CFGBatching(
            negative=lambda encoded: tuple(encoded),
            condition_args=(
                "encoder_hidden_states",
                "encoder_attention_mask",
                "encoder_hidden_states_2",
                "encoder_attention_mask_2",
            ),
            negative_call=1,
            batched_args=("hidden_states", "timestep", "image_embeds"),
        ),
        decode_latents=decode_latents,
        staging=Staging(encode=stage_encode, inputs=stage_inputs),
        planning=Planning(
            call=plan_call,
            forward_flops=lambda pipe, h, w, f, text: forward_flops(
                pipe.transformer.config,
                (f - 1) // pipe.vae_scale_factor_temporal + 1,
                h // pipe.vae_scale_factor_spatial,
                w // pipe.vae_scale_factor_spatial,
                _text_tokens(pipe),
            ),
        ),
    )
)
