"""Causal (block-autoregressive) Wan: the stock Wan 2.1 transformer run block by block over a static KV cache.

Frames are grouped in blocks of ``num_frame_per_block``. A block attends to itself, to the first ``sink_size``
frames and to the last ``local_attn_size`` earlier frames (all earlier frames when -1). The same model runs:

- the whole sequence at once with the equivalent block-causal mask (``kv_cache=None``: the reference), or
- one block at a time against ``kv_cache`` (``new_kv_cache``): per layer a ring buffer ``[B, slots, H, D]`` of
  post-RoPE keys and values, where sink frames keep their slots and later frames cycle through the rest. Every
  shape is static and the block's position (``frame_offset``) is a tensor, so one compiled program serves every
  block: writes are a scatter at traced slot indices (a block may straddle the sink/ring boundary, so one
  contiguous dynamic-update-slice would not do), and attention takes the cache with a key mask of written
  slots (the kernel's ``kv_mask`` on JAX; plain torch SDPA elsewhere: identical math on both paths).

The weights and parameter names are the stock ``WanTransformer3DModel``'s (this is a subclass): a Wan
checkpoint loads with ``from_pretrained``, or ``CausalWanTransformer3DModel.from_transformer(wan_transformer)``.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from diffusers import WanTransformer3DModel
from diffusers.configuration_utils import register_to_config
from diffusers.models.modeling_outputs import Transformer2DModelOutput
from diffusers.models.transformers.transformer_wan import WanRotaryPosEmbed

CAUSAL_DEFAULTS = dict(num_frame_per_block=3, sink_size=0, local_attn_size=-1)


class OffsetRotaryPosEmbed(WanRotaryPosEmbed):
    """Wan's 3-D RoPE with the frame axis starting at ``frame_offset`` (an int or a 0-d tensor)."""

    frame_offset = 0

    def forward(self, hidden_states):
        _, _, frames, height, width = hidden_states.shape
        p_t, p_h, p_w = self.patch_size
        ppf, pph, ppw = frames // p_t, height // p_h, width // p_w
        positions = torch.arange(ppf, device=self.freqs_cos.device) + self.frame_offset
        tables = []
        for table in (self.freqs_cos, self.freqs_sin):
            t, h, w = table.split([self.t_dim, self.h_dim, self.w_dim], dim=1)
            t = t.index_select(0, positions).view(ppf, 1, 1, -1).expand(ppf, pph, ppw, -1)
            h = h[:pph].view(1, pph, 1, -1).expand(ppf, pph, ppw, -1)
            w = w[:ppw].view(1, 1, ppw, -1).expand(ppf, pph, ppw, -1)
            tables.append(torch.cat([t, h, w], dim=-1).reshape(1, ppf * pph * ppw, 1, -1))
        return tuple(tables)


@dataclasses.dataclass
class _Call:
    """What the self-attention processors need during one forward."""

    mask: torch.Tensor | None = None  # full sequence: [S, S] bool
    cache: dict | None = None
    key_mask: torch.Tensor | None = None  # cached call: [1, 1, 1, slots + S] bool
    token_slots: torch.Tensor | None = None  # where this block's tokens go in the ring
    write: bool = False
    written: dict = dataclasses.field(default_factory=lambda: {"k": {}, "v": {}})


def _rotate(x, cos, sin):
    """Wan's interleaved rotary embedding (transformer_wan.py's ``apply_rotary_emb``)."""
    x1, x2 = x.unflatten(-1, (-1, 2)).unbind(-1)
    cos, sin = cos[..., 0::2], sin[..., 1::2]
    return torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).flatten(-2).type_as(x)


class CausalSelfAttnProcessor:
    """Self-attention (``attn1``) of block ``layer``: block-causal over the full sequence, or against the cache."""

    def __init__(self, owner, layer: int):
        self.owner, self.layer = owner, layer

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, rotary_emb=None):
        call: _Call = self.owner._causal_call
        query = attn.norm_q(attn.to_q(hidden_states)).unflatten(2, (attn.heads, -1))
        key = attn.norm_k(attn.to_k(hidden_states)).unflatten(2, (attn.heads, -1))
        value = attn.to_v(hidden_states).unflatten(2, (attn.heads, -1))
        if rotary_emb is not None:
            query, key = _rotate(query, *rotary_emb), _rotate(key, *rotary_emb)
        if call.cache is None:
            keys, values, mask = key, value, call.mask[None, None]
        else:
            cached_k, cached_v = call.cache["k"][self.layer], call.cache["v"][self.layer]
            keys, values, mask = torch.cat([cached_k, key], 1), torch.cat([cached_v, value], 1), call.key_mask
            if call.write:
                call.written["k"][self.layer] = cached_k.index_copy(1, call.token_slots, key.to(cached_k.dtype))
                call.written["v"][self.layer] = cached_v.index_copy(1, call.token_slots, value.to(cached_v.dtype))
        out = F.scaled_dot_product_attention(
            query.transpose(1, 2),
            keys.transpose(1, 2).to(query.dtype),
            values.transpose(1, 2).to(query.dtype),
            attn_mask=mask,
        )
        out = out.transpose(1, 2).flatten(2, 3).type_as(query)
        return attn.to_out[1](attn.to_out[0](out))


def frame_slots(frames, sink_size: int, local_attn_size: int):
    """Ring-buffer slot of each absolute frame index: sinks keep theirs, later frames cycle through the ring."""
    if local_attn_size < 0:
        return frames
    return torch.where(frames < sink_size, frames, sink_size + (frames - sink_size) % local_attn_size)


def visible_frames(num_frames: int, num_frame_per_block: int, sink_size: int, local_attn_size: int, device=None):
    """[F, F] bool: query frame i sees key frame j (its own block, sinks, the last ``local_attn_size`` earlier)."""
    frame = torch.arange(num_frames, device=device)
    block = frame // num_frame_per_block
    start = block * num_frame_per_block
    q_block, k_block = block[:, None], block[None, :]
    window = (
        torch.ones_like(q_block == k_block)
        if local_attn_size < 0
        else frame[None, :] >= start[:, None] - local_attn_size
    )
    earlier = (k_block < q_block) & ((frame[None, :] < sink_size) | window)
    return (k_block == q_block) | earlier


class CausalWanTransformer3DModel(WanTransformer3DModel):
    """``WanTransformer3DModel`` run block-causally (see the module docstring). Extra config:
    ``num_frame_per_block`` (latent frames per block), ``sink_size`` (first frames always attended),
    ``local_attn_size`` (earlier frames attended besides the sinks; -1: all). Frame counts are after patching."""

    # Wan's arguments spelled out: diffusers builds a model from a saved config by this signature.
    @register_to_config
    def __init__(
        self,
        patch_size: tuple[int, ...] = (1, 2, 2),
        num_attention_heads: int = 40,
        attention_head_dim: int = 128,
        in_channels: int = 16,
        out_channels: int = 16,
        text_dim: int = 4096,
        freq_dim: int = 256,
        ffn_dim: int = 13824,
        num_layers: int = 40,
        cross_attn_norm: bool = True,
        qk_norm: str | None = "rms_norm_across_heads",
        eps: float = 1e-06,
        image_dim: int | None = None,
        added_kv_proj_dim: int | None = None,
        rope_max_seq_len: int = 1024,
        pos_embed_seq_len: int | None = None,
        num_frame_per_block: int = 3,
        sink_size: int = 0,
        local_attn_size: int = -1,
    ):
        super().__init__(
            patch_size,
            num_attention_heads,
            attention_head_dim,
            in_channels,
            out_channels,
            text_dim,
            freq_dim,
            ffn_dim,
            num_layers,
            cross_attn_norm,
            qk_norm,
            eps,
            image_dim,
            added_kv_proj_dim,
            rope_max_seq_len,
            pos_embed_seq_len,
        )
        if num_frame_per_block < 1 or sink_size < 0:
            raise ValueError(f"num_frame_per_block={num_frame_per_block} must be >= 1 and sink_size={sink_size} >= 0.")
        if local_attn_size != -1 and local_attn_size < num_frame_per_block:
            raise ValueError(
                f"local_attn_size={local_attn_size} must be -1 (every earlier frame) or at least num_frame_per_block="
                f"{num_frame_per_block}, so one block's frames never share a ring slot."
            )
        rope = self.rope
        self.rope = OffsetRotaryPosEmbed(rope.attention_head_dim, rope.patch_size, rope.max_seq_len)
        for layer, block in enumerate(self.blocks):
            block.attn1.set_processor(CausalSelfAttnProcessor(self, layer))
        self._causal_call = None

    @classmethod
    def from_transformer(cls, transformer: WanTransformer3DModel, **causal) -> CausalWanTransformer3DModel:
        """The causal model with ``transformer``'s config and weights (``causal``: the extra config). The weights
        are shared, not copied, and keep their dtypes (float32 modules stay float32)."""
        config = {k: v for k, v in transformer.config.items() if not k.startswith("_")}
        with torch.device("meta"):
            model = cls(**{**config, **CAUSAL_DEFAULTS, **causal})
        model.load_state_dict(transformer.state_dict(), assign=True)
        for name, buffer in transformer.rope.named_buffers():  # non-persistent: not in the state dict
            setattr(model.rope, name, buffer)
        return model.eval()

    def cache_frames(self, max_frames: int | None = None) -> int:
        """Frames the ring buffer holds: sinks + window, or ``max_frames`` when the window is unbounded."""
        if self.config.local_attn_size >= 0:
            return self.config.sink_size + self.config.local_attn_size
        if max_frames is None:
            raise ValueError("local_attn_size=-1 keeps every frame: pass max_frames (the video's latent frames).")
        return max_frames

    def new_kv_cache(self, batch: int, tokens_per_frame: int, max_frames: int | None = None, dtype=None, device=None):
        """An empty cache: per layer ``k``/``v`` ``[B, slots, heads, head_dim]``, and ``slot_frame`` (-1 = empty)."""
        heads, dim = self.config.num_attention_heads, self.config.attention_head_dim
        frames = self.cache_frames(max_frames)
        shape = (batch, frames * tokens_per_frame, heads, dim)
        dtype = dtype or self.dtype
        zeros = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(2 * len(self.blocks))]
        return {
            "k": zeros[::2],
            "v": zeros[1::2],
            "slot_frame": torch.full((frames,), -1, dtype=torch.int32, device=device),
        }

    def forward(
        self,
        hidden_states,
        timestep,
        encoder_hidden_states,
        encoder_hidden_states_image=None,
        return_dict: bool = True,
        attention_kwargs=None,
        kv_cache: dict | None = None,
        frame_offset=0,
        write_cache: bool = False,
    ):
        """The stock forward, block-causal. ``kv_cache=None``: the whole sequence at once (frame 0 first).
        Otherwise ``hidden_states`` is one block starting at latent frame ``frame_offset`` (int or 0-d tensor);
        returns ``(sample, kv_cache)`` with the cache updated by this block's keys/values when ``write_cache``,
        else ``(sample, None)`` (the cache is unchanged; returning it from a compiled program would copy it)."""
        config = self.config
        p_t, p_h, p_w = config.patch_size
        _, _, frames, height, width = hidden_states.shape
        frames, per_frame = frames // p_t, (height // p_h) * (width // p_w)
        call = _Call(write=write_cache)
        if kv_cache is None:
            visible = visible_frames(
                frames,
                config.num_frame_per_block,
                config.sink_size,
                config.local_attn_size,
                device=hidden_states.device,
            )
            call.mask = visible.repeat_interleave(per_frame, 0).repeat_interleave(per_frame, 1)
        else:
            block_frames = torch.arange(frames, device=hidden_states.device) + frame_offset
            slots = frame_slots(block_frames, config.sink_size, config.local_attn_size)
            offsets = torch.arange(per_frame, device=hidden_states.device)
            call.token_slots = (slots[:, None] * per_frame + offsets[None, :]).flatten()
            written = (kv_cache["slot_frame"] >= 0).repeat_interleave(per_frame)
            own = torch.ones(frames * per_frame, dtype=torch.bool, device=hidden_states.device)
            call.key_mask = torch.cat([written, own])[None, None, None, :]
            call.cache = kv_cache
        self._causal_call, self.rope.frame_offset = call, frame_offset
        try:
            sample = super().forward(
                hidden_states,
                timestep,
                encoder_hidden_states,
                encoder_hidden_states_image,
                return_dict=False,
                attention_kwargs=attention_kwargs,
            )[0]
        finally:
            self._causal_call, self.rope.frame_offset = None, 0
        if kv_cache is None:
            return Transformer2DModelOutput(sample=sample) if return_dict else (sample,)
        if not write_cache:
            return sample, None
        return sample, {
            "k": [call.written["k"][i] for i in range(len(self.blocks))],
            "v": [call.written["v"][i] for i in range(len(self.blocks))],
            "slot_frame": kv_cache["slot_frame"].index_copy(0, slots, block_frames.to(torch.int32)),
        }
