"""Wan's self-attention with the rotary embedding through ``runtime.rotary`` (the Pallas kernel on TPU).

Why: diffusers' ``WanAttnProcessor.__call__`` (and SkyReels-V2's copy of it) defines ``apply_rotary_emb`` inside
the call, on the pair layout ``[..., D/2, 2]`` with strided writes. The TPU compiler lays q and k out sequence-minor
around it and copies them there and back: 4-6 layout copies of ``[S, H*D]`` per block (BENCHMARKS.md, "Beside
maxdiffusion"). Nothing outside the call can reach that function, so the self-attention branch (rotary embedding, no
encoder states, no added keys) is restated here, operation for operation, with the rotation replaced by
``runtime.rotary.rotate`` (the same float32 arithmetic, rounded once); every other call (cross-attention, I2V's
image keys) is the stock method itself.

Installed per instance by ``install`` (``runtime.kernel_processors``: only over the exact stock class, undone by
``pipe.to("cpu")``, only while diffusers' source is the one restated: ``RESTATED``).
"""

from __future__ import annotations

import functools

from diffusers.models.transformers import transformer_skyreels_v2, transformer_wan

from ..runtime.attention import kernel_processors, rotary

# the source digests of the stock ``__call__`` each subclass restates (``kernel_processors.restates``)
RESTATED = {"WanAttnProcessor": "13c09feedcfe814a", "SkyReelsV2AttnProcessor": "be927e58ea7fba80"}


def _kernel_rotary_processor(stock: type, projections):
    """A subclass of the stock processor ``stock`` whose rotary self-attention runs the rotation through the kernel;
    ``projections`` is the stock module's ``_get_qkv_projections`` (fused projections included)."""

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, rotary_emb=None):
        if rotary_emb is None or encoder_hidden_states is not None or attn.add_k_proj is not None:
            return stock.__call__(self, attn, hidden_states, encoder_hidden_states, attention_mask, rotary_emb)
        query, key, value = projections(attn, hidden_states, encoder_hidden_states)
        query = attn.norm_q(query).unflatten(2, (attn.heads, -1))
        key = attn.norm_k(key).unflatten(2, (attn.heads, -1))
        value = value.unflatten(2, (attn.heads, -1))
        query, key = rotary.rotate(query, key, freqs_cos=rotary_emb[0], freqs_sin=rotary_emb[1])
        hidden_states = transformer_wan.dispatch_attention_fn(
            query,
            key,
            value,
            attn_mask=attention_mask,
            dropout_p=0.0,
            is_causal=False,
            backend=self._attention_backend,
            parallel_config=self._parallel_config,
        )
        hidden_states = hidden_states.flatten(2, 3).type_as(query)
        return attn.to_out[1](attn.to_out[0](hidden_states))

    kind = type(f"KernelRotary{stock.__name__}", (stock,), {"__call__": __call__, "__module__": __name__})
    return kernel_processors.restates(RESTATED[stock.__name__])(kind)


@functools.cache
def _processors() -> dict[type, type]:
    return {
        stock: _kernel_rotary_processor(stock, module._get_qkv_projections)
        for stock, module in (
            (transformer_wan.WanAttnProcessor, transformer_wan),
            (transformer_skyreels_v2.SkyReelsV2AttnProcessor, transformer_skyreels_v2),
        )
    }


def install(runtime, transformer) -> int:
    """Wan's and SkyReels-V2's stock processors of ``transformer`` swapped for their kernel-rotary subclasses."""
    return kernel_processors.install(runtime, transformer, _processors())
