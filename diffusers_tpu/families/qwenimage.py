"""Qwen-Image (``QwenImagePipeline``): sharding, the true-CFG pair as one dp-sharded batch, FLOPs.

Jit notes: the rotary tables are cached with ``lru_cache`` in stock code; while JAX traces,
``torch.compiler.is_compiling()`` is True (``compat.torch_itself``), so stock bypasses the cache instead of leaking
tracers into it. The text
padding reaches attention as a joint ``[B, 1, 1, N]`` key mask (the kernel's key mask). With a negative prompt
and ``true_cfg_scale > 1`` the model runs twice per step ("cond"/"uncond"); the two prompts are padded to their own
lengths, so the pair is batched with the shorter text padded by masked tokens (exact: masked keys get no weight and
text outputs are discarded). The text encoder runs on the host; its outputs join the device, as on a GPU.
"""

from __future__ import annotations

import diffusers

from ..runtime.registry import CFGBatching, Family, Planning, register
from . import flux

_BLOCK = r"^transformer_blocks\.\d+\."
# the double-stream MMDiT layout: image and text q/k/v column-parallel, both outputs row-parallel, both MLPs
SHARD_RULES = (
    (_BLOCK + r"attn\.(to_q|to_k|to_v|add_q_proj|add_k_proj|add_v_proj)\.weight$", ("tp", None)),
    (_BLOCK + r"attn\.(to_q|to_k|to_v|add_q_proj|add_k_proj|add_v_proj)\.bias$", ("tp",)),
    (_BLOCK + r"attn\.(to_out\.0|to_add_out)\.weight$", (None, "tp")),
    (_BLOCK + r"(img_mlp|txt_mlp)\.net\.0\.proj\.weight$", ("tp", None)),
    (_BLOCK + r"(img_mlp|txt_mlp)\.net\.0\.proj\.bias$", ("tp",)),
    (_BLOCK + r"(img_mlp|txt_mlp)\.net\.2\.weight$", (None, "tp")),
)
ACTIVATION_RULES = ((r"^transformer_blocks\.\d+$", ("dp", "sp", None)),)


def forward_flops(config, latent_height: int, latent_width: int, text_tokens: int) -> int:
    """Matmul FLOPs of one forward for one sample over T = image + text tokens: q/k/v/out for both streams
    8*T*d^2, attention 4*T^2*d, both MLPs 16*T*d^2; plus the input and output projections."""
    tokens = (latent_height // 2) * (latent_width // 2)
    total = tokens + text_tokens
    dim = config.num_attention_heads * config.attention_head_dim
    block = 8 * total * dim**2 + 4 * total**2 * dim + 16 * total * dim**2
    edges = 2 * tokens * dim * (config.in_channels + 4 * config.out_channels)
    edges += 2 * text_tokens * config.joint_attention_dim * dim
    return config.num_layers * block + edges


FAMILY = register(
    Family(
        name="qwenimage",
        pipelines=(diffusers.QwenImagePipeline,),
        denoisers=("transformer",),
        shard_rules=SHARD_RULES,
        activation_rules=ACTIVATION_RULES,
        # encode_prompt -> (embeddings, mask); called a second time for the negative prompt
        cfg=CFGBatching(
            negative=lambda encoded: (encoded[0], encoded[1]),
            condition_args=("encoder_hidden_states", "encoder_hidden_states_mask"),
            negative_call=1,
            pad_text=True,
            batched_args=("hidden_states", "timestep", "guidance"),
        ),
        planning=Planning(forward_flops=flux.on_packed_latents(forward_flops)),
    )
)
