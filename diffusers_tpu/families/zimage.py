"""Z-Image (``ZImagePipeline``): sharding and FLOPs; the jit fixes it needed are general ones.

The transformer takes lists of per-sample latents and variable-length caption embeddings (each prompt's valid tokens,
selected with a boolean mask on the host side of the loop) and packs them itself; the pipeline batches its CFG pair as
one list, which the runtime shards over dp. What stock code did that a trace could not take, fixed generally:
``RopeEmbedder`` caches its rotary tables on itself on first use (``interop.module_state`` finds them to depend on no
input: a cache, dropped after each trace), ``embeddings[i][mask[i]]`` indexed a lazy torchax view and ``mask[:n] = 1``
scattered an int into a bool tensor (``compat``).
"""

from __future__ import annotations

import diffusers

from ..runtime.registry import Family, Planning, register

_LAYER = r"^(layers|noise_refiner|context_refiner)\.\d+\."
# Megatron-style tp over whole heads; the SwiGLU MLP's w1/w3 are column-parallel, w2 row-parallel
SHARD_RULES = (
    (_LAYER + r"attention\.(to_q|to_k|to_v)\.weight$", ("tp", None)),
    (_LAYER + r"attention\.to_out\.0\.weight$", (None, "tp")),
    (_LAYER + r"feed_forward\.(w1|w3)\.weight$", ("tp", None)),
    (_LAYER + r"feed_forward\.w2\.weight$", (None, "tp")),
)
ACTIVATION_RULES = ((r"^layers\.\d+$", ("dp", "sp", None)),)


def forward_flops(config, latent_height: int, latent_width: int, text_tokens: int) -> int:
    """Matmul FLOPs of one forward for one sample over T = image + caption tokens: attention 8*T*d^2 + 4*T^2*d and
    the SwiGLU MLP 6*T*d*m per layer (refiners over their own stream); plus the embedders."""
    patch = config.all_patch_size[0]
    image = (latent_height // patch) * (latent_width // patch)
    dim, total = config.dim, image + text_tokens
    mlp = int(dim / 3 * 8)
    layer = lambda n: 8 * n * dim**2 + 4 * n**2 * dim + 6 * n * dim * mlp  # noqa: E731
    return (
        config.n_layers * layer(total)
        + config.n_refiner_layers * (layer(image) + layer(text_tokens))
        + 2 * image * patch * patch * config.in_channels * dim * 2
        + 2 * text_tokens * config.cap_feat_dim * dim
    )


FAMILY = register(
    Family(
        name="zimage",
        pipelines=(diffusers.ZImagePipeline,),
        denoisers=("transformer",),
        shard_rules=SHARD_RULES,
        activation_rules=ACTIVATION_RULES,
        num_heads=lambda pipe: pipe.transformer.config.n_heads,
        planning=Planning(
            forward_flops=lambda pipe, h, w, f, text: forward_flops(
                pipe.transformer.config, h // pipe.vae_scale_factor, w // pipe.vae_scale_factor, text
            )
        ),
    )
)
