"""diffusers' ``flex`` attention backend on JAX: a ``BlockMask`` made dense, then the project's attention.

torch's ``flex_attention`` is a higher-order op with no JAX lowering. Models that build a ``BlockMask`` and name the
``flex`` backend themselves (AnyFlow FAR's chunk-causal mask, Kandinsky 6 SR's NABLA) get, for JAX tensors, a
backend of the same signature that turns the mask into a boolean ``[B, H, Lq, Lkv]`` mask — the blocks it lists,
``mask_mod`` applied inside partial blocks, full blocks whole — and runs ``scaled_dot_product_attention`` with it
(the project's kernel or its exact reference). Rows no key may see give 0, as flex does. The dense mask costs
``Lq x Lkv`` booleans per batch and head entry: exact, not sparse (Known limits)."""

from __future__ import annotations

import functools
import weakref

import torch
from torch.nn.attention.flex_attention import BlockMask

from ...interop import backend, static_keys

_KEYS_OF_MASKS: "weakref.WeakKeyDictionary[BlockMask, tuple]" = weakref.WeakKeyDictionary()


def _block_mask_key(mask: BlockMask) -> tuple:
    """What a traced program reads of a ``BlockMask`` (``dense_mask``): equal masks share one program. Read once
    per mask object (a pipeline passes one mask to every step: its tensors leave the devices once)."""
    key = _KEYS_OF_MASKS.get(mask)
    if key is None:
        tensors = (mask.kv_num_blocks, mask.kv_indices, mask.full_kv_num_blocks, mask.full_kv_indices)
        key = _KEYS_OF_MASKS[mask] = (
            tuple(mask.seq_lengths),
            tuple(mask.BLOCK_SIZE),
            static_keys.content_key(tensors),
            static_keys.content_key(mask.mask_mod),
        )
    return key


static_keys.register(BlockMask, _block_mask_key)  # AnyFlow FAR makes a new, equal mask on every call


def _blocks_dense(num_blocks: torch.Tensor, indices: torch.Tensor, kv_blocks: int) -> torch.Tensor:
    """``[B, H, Q blocks, KV blocks]`` booleans: the first ``num_blocks`` entries of each row of ``indices``."""
    listed = torch.arange(indices.shape[-1], device=indices.device) < num_blocks[..., None]
    hits = (indices[..., None] == torch.arange(kv_blocks, device=indices.device)) & listed[..., None]
    return hits.any(dim=-2)


def _tokens(blocks: torch.Tensor, block_size: tuple[int, int], q_len: int, kv_len: int) -> torch.Tensor:
    q_block, kv_block = block_size
    return blocks.repeat_interleave(q_block, dim=-2)[..., :q_len, :].repeat_interleave(kv_block, dim=-1)[..., :kv_len]


def dense_mask(block_mask) -> torch.Tensor:
    """The boolean ``[B, H, Lq, Lkv]`` mask a ``BlockMask`` stands for (B, H of 1 where the mask broadcasts)."""
    q_len, kv_len = block_mask.seq_lengths
    kv_blocks = -(-kv_len // block_mask.BLOCK_SIZE[1])
    partial = _blocks_dense(block_mask.kv_num_blocks, block_mask.kv_indices, kv_blocks)
    batch, heads = partial.shape[:2]
    device = partial.device
    index = [
        torch.arange(n, device=device).view(*(n if i == axis else 1 for i in range(4)))
        for axis, n in enumerate((batch, heads, q_len, kv_len))
    ]
    allowed = _tokens(partial, block_mask.BLOCK_SIZE, q_len, kv_len) & block_mask.mask_mod(*index)
    if block_mask.full_kv_num_blocks is not None:
        full = _blocks_dense(block_mask.full_kv_num_blocks, block_mask.full_kv_indices, kv_blocks)
        allowed = allowed | _tokens(full, block_mask.BLOCK_SIZE, q_len, kv_len)
    return allowed


def flex_as_sdpa(
    query,
    key,
    value,
    attn_mask=None,
    is_causal=False,
    scale=None,
    enable_gqa=False,
    return_lse=False,
    _parallel_config=None,
):
    """diffusers' flex backend signature (``[B, L, H, D]`` in and out) through ``scaled_dot_product_attention``."""
    if return_lse:
        raise NotImplementedError(
            "flex attention with return_lse=True has no JAX path here; keep this pipeline on "
            "a torch device, or open an issue."
        )
    if isinstance(attn_mask, BlockMask):
        if tuple(attn_mask.seq_lengths) != (query.shape[1], key.shape[1]):
            raise ValueError(
                f"BlockMask for {tuple(attn_mask.seq_lengths)} tokens, attention over "
                f"{(query.shape[1], key.shape[1])}: flex attention on JAX takes a mask of the same size."
            )
        attn_mask = dense_mask(attn_mask)
        no_key = ~attn_mask.any(dim=-1, keepdim=True)  # flex gives such rows 0
    else:
        no_key = None
    out = torch.nn.functional.scaled_dot_product_attention(
        *(x.transpose(1, 2) for x in (query, key, value)),
        attn_mask=attn_mask,
        is_causal=is_causal,
        scale=scale,
        enable_gqa=enable_gqa,
    )
    if no_key is not None:
        out = out.masked_fill(no_key, 0.0)
    return out.transpose(1, 2)


def serving_jax(stock):
    """diffusers' ``flex`` backend function: ``flex_as_sdpa`` for JAX tensors, ``stock`` for any other (registered
    once, ``stock_classes``)."""

    @functools.wraps(stock)
    def flex(query, *args, **kwargs):
        return (flex_as_sdpa if backend.is_jax_tensor(query) else stock)(query, *args, **kwargs)

    return flex
