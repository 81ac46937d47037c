"""NucleusMoE-Image (``NucleusMoEImagePipeline``): the guidance pair as one dp-sharded batch, the experts and the
rotary tables made jit-safe, sharding as the generic path infers it (experts over ``tp`` by their hidden width).

Jit notes, each fixed on the placed pipeline's own modules (undone by ``pipe.to("cpu")``):
- ``SwiGLUExperts`` splits its tokens by ``num_tokens_per_expert.tolist()`` (a host read a trace cannot make) or
  ``F.grouped_mm`` (not lowered by torchax). Both become ``jax.lax.ragged_dot`` — the grouped matmul itself, group
  sizes read on the devices: the same rows per expert for any counts, padding rows zero as stock's.
- ``NucleusMoEEmbedRope._compute_video_freqs`` is a plain ``functools.lru_cache``: a trace would leave tracers in it
  for later programs. While JAX traces it is computed afresh (as diffusers' ``lru_cache_unless_export`` does).

The single-stream blocks use the text only as keys and values (masked where padded), and the experts route each
sample's image tokens on their own (expert choice over one sample's sequence): the "cond" and "uncond" calls batch
exactly, the shorter text padded with masked tokens. TextKVCache, which keeps each block's text keys and values per
prompt, runs inside the whole-step programs (``runtime/call/step_caches/text_kv.py``).
"""

from __future__ import annotations

import functools
import types

import diffusers
import jax
import torch

from ..interop.backend import to_jax_array, wrap
from ..runtime.registry import CFGBatching, Family, register
from .generic import infer_rules

try:  # diffusers >= 0.42
    from diffusers.models.transformers import transformer_nucleusmoe_image as stock
except ImportError:
    stock = None

# the experts' weights ([experts, in, out]) split over tp by their hidden width: gate/up column-parallel, down
# row-parallel, as a dense SwiGLU's; each block's projection of the text states column-parallel (replicated, every
# tp device made all of it: 90 of a v6e-8 device's 1,572 GFLOP a step at 1024² with 256 text tokens, BENCHMARKS)
SHARD_RULES = (
    (r"^transformer_blocks\.\d+\.encoder_proj\.weight$", ("tp", None)),
    (r"^transformer_blocks\.\d+\.encoder_proj\.bias$", ("tp",)),
    (r"^transformer_blocks\.\d+\.img_mlp\.experts\.gate_up_proj$", (None, None, "tp")),
    (r"^transformer_blocks\.\d+\.img_mlp\.experts\.down_proj$", (None, "tp", None)),
)


def swiglu_experts(rows, sizes, gate_up, down):
    """Rows sorted by expert (``sizes[e]`` rows each, in order) through their expert's SwiGLU, ``silu(x @ gate) *
    (x @ up) @ down`` (``gate_up``: ``[experts, in, 2 * hidden]``, gate then up); rows past the last group zero."""
    # bfloat16 operands: their products are exact at the default precision, the one TPU's grouped-matmul kernel takes
    # for them (the configured "highest" is refused by its compiler); float32 ones follow the configured precision
    precision = jax.lax.Precision.DEFAULT if rows.dtype == jax.numpy.bfloat16 else None
    grouped = functools.partial(jax.lax.ragged_dot, group_sizes=sizes.astype(jax.numpy.int32), precision=precision)
    gate, up = jax.numpy.split(grouped(rows, gate_up.astype(rows.dtype)), 2, axis=-1)
    return grouped(jax.nn.silu(gate) * up, down.astype(rows.dtype))


def grouped_swiglu(experts, x: torch.Tensor, num_tokens_per_expert: torch.Tensor) -> torch.Tensor:
    """``SwiGLUExperts._run_experts_for_loop`` (and its grouped-matmul twin) on JAX: ``swiglu_experts``."""
    weights = (to_jax_array(experts.gate_up_proj), to_jax_array(experts.down_proj))
    return wrap(swiglu_experts(to_jax_array(x), to_jax_array(num_tokens_per_expert), *weights))


def _video_freqs(rope, stock_method):
    """The rope's cached tables outside traces; computed afresh inside one (no tracer left in the cache)."""

    @functools.wraps(stock_method)
    def video_freqs(*args, **kwargs):
        if torch.compiler.is_compiling():
            return stock_method.__wrapped__(rope, *args, **kwargs)
        return stock_method(rope, *args, **kwargs)

    return video_freqs


def prepare(pipe, runtime) -> None:
    for module in pipe.transformer.modules():
        if isinstance(module, stock.SwiGLUExperts):
            grouped = types.MethodType(grouped_swiglu, module)  # bound: the blocks' signatures stay equal
            runtime.overrides.set(module, "_run_experts_for_loop", grouped)
            runtime.overrides.set(module, "_run_experts_grouped_mm", grouped)
        elif isinstance(module, stock.NucleusMoEEmbedRope):
            method = type(module)._compute_video_freqs
            if hasattr(method, "__wrapped__"):  # stock's lru_cache (diffusers 0.42)
                runtime.overrides.set(module, "_compute_video_freqs", _video_freqs(module, method))


FAMILY = (
    None
    if stock is None
    else register(  # diffusers < 0.42 has no NucleusMoE-Image
        Family(
            name="nucleusmoe",
            pipelines=(diffusers.NucleusMoEImagePipeline,),
            denoisers=("transformer",),
            shard_rules=SHARD_RULES,
            rules_for=infer_rules,
            activation_rules=((r"^transformer_blocks\.\d+$", ("dp", "sp", None)),),
            # encode_prompt -> (embeddings, mask); called a second time for the negative prompt
            cfg=CFGBatching(
                negative=lambda encoded: (encoded[0], encoded[1]),
                condition_args=("encoder_hidden_states", "encoder_hidden_states_mask"),
                negative_call=1,
                pad_text=True,
                batched_args=("hidden_states", "timestep"),
            ),
            prepare=prepare,
        )
    )
)
