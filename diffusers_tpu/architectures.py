"""Real-size pipelines with random weights, built from published configs with no download (for benchmarks).

Parameters are created empty (accelerate's ``init_empty_weights``) and then filled in place — normal(0, 0.02)
for matrices, ones for norm scales, zeros for biases — so no time goes into torch's default initializers, while
buffers (RoPE tables and the like) keep their real computed values. The videos are noise; the shapes, FLOPs and
memory are the real model's. Host memory: the text encoders are large (UMT5-XXL is 6.7B parameters, 13.5 GB in
bfloat16), so Wan2.1-1.3B needs roughly 24 GB of host RAM or more; TPU and GPU hosts have that, small VMs do not.
"""

from __future__ import annotations

import torch

from . import cogvideox, tiny, wan

# UMT5-XXL (Wan's text encoder) and T5-v1.1-XXL (CogVideoX's), encoder halves.
_T5_XXL = dict(d_model=4096, d_kv=64, d_ff=10240, num_layers=24, num_heads=64, relative_attention_num_buckets=32,
               relative_attention_max_distance=128, feed_forward_proj="gated-gelu", dropout_rate=0.0,
               is_encoder_decoder=False, pad_token_id=0, eos_token_id=1)
UMT5_XXL = dict(_T5_XXL, vocab_size=256384)
T5_V11_XXL = dict(_T5_XXL, vocab_size=32128)

# family, transformer / text encoder / VAE configs ({} = the diffusers class defaults, which are the real VAEs).
ARCHITECTURES = {
    "Wan2.1-1.3B": dict(family="wan", transformer=wan.WAN21_1_3B, text_encoder=UMT5_XXL, vae={}, flow_shift=3.0),
    "Wan2.1-14B": dict(family="wan", transformer=wan.WAN21_14B, text_encoder=UMT5_XXL, vae={}, flow_shift=5.0),
    "CogVideoX1.5-5B": dict(family="cogvideox", transformer=cogvideox.COGVIDEOX15_5B, text_encoder=T5_V11_XXL, vae={}),
}


def _fill(module: torch.nn.Module, dtype: torch.dtype, generator: torch.Generator | None) -> None:
    """``generator=None``: parameters stay on ``meta``, only their dtypes are set (as ``from_pretrained`` would)."""
    from .sharding import _keep_in_fp32

    keep = getattr(module, "_keep_in_fp32_modules", None) or ()
    for prefix, owner in module.named_modules():
        for name, param in list(owner._parameters.items()):
            if param is None or not param.is_meta:
                continue
            qualified = f"{prefix}.{name}" if prefix else name
            value = torch.empty(param.shape, dtype=torch.float32 if _keep_in_fp32(qualified, keep) else dtype,
                                device="cpu" if generator is not None else "meta")
            if generator is not None and param.ndim >= 2:
                value.normal_(0.0, 0.02, generator=generator)
            elif generator is not None:
                value.fill_(0.0 if name == "bias" else 1.0)
            owner._parameters[name] = torch.nn.Parameter(value, requires_grad=False)


def _empty(build):
    from accelerate import init_empty_weights

    with init_empty_weights(include_buffers=False):
        return build()


def build(name: str, dtype: torch.dtype = torch.bfloat16, seed: int = 0, weights: bool = True):
    """The named real-size pipeline (``ARCHITECTURES``) with random weights, on the CPU; ``weights=False``: its
    parameters stay on the ``meta`` device (shapes only, for ``plan``)."""
    if name not in ARCHITECTURES:
        raise ValueError(f"Unknown architecture {name!r}; choose one of {sorted(ARCHITECTURES)}.")
    import diffusers
    from transformers import T5Config, T5EncoderModel, UMT5Config, UMT5EncoderModel

    spec = ARCHITECTURES[name]
    if spec["family"] == "wan":
        transformer = _empty(lambda: diffusers.WanTransformer3DModel(**spec["transformer"]))
        vae = _empty(lambda: diffusers.AutoencoderKLWan(**spec["vae"]))
        text_encoder = _empty(lambda: UMT5EncoderModel(UMT5Config(**spec["text_encoder"])))
        scheduler = diffusers.UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True,
                                                      flow_shift=spec["flow_shift"])
        cls = diffusers.WanPipeline
    else:
        transformer = _empty(lambda: diffusers.CogVideoXTransformer3DModel(**spec["transformer"]))
        vae = _empty(lambda: diffusers.AutoencoderKLCogVideoX(**spec["vae"]))
        text_encoder = _empty(lambda: T5EncoderModel(T5Config(**spec["text_encoder"])))
        scheduler = diffusers.CogVideoXDPMScheduler(**tiny.COGVIDEOX_SCHEDULER)
        cls = diffusers.CogVideoXPipeline
    generator = torch.Generator().manual_seed(seed)
    # The denoiser and text encoder in ``dtype`` (keeping the model's float32 modules, as from_pretrained does);
    # the VAE in float32, as diffusers' examples load it.
    for module, module_dtype in ((transformer, dtype), (text_encoder, dtype), (vae, torch.float32)):
        _fill(module, module_dtype, generator if weights else None)
        module.eval()
    return cls(transformer=transformer, vae=vae, text_encoder=text_encoder, tokenizer=tiny.char_tokenizer(),
               scheduler=scheduler)
