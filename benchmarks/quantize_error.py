"""What ``TPUConfig(quantize=...)`` costs and saves, measured: ``python benchmarks/quantize_error.py``.

- weight bytes of a real-size denoiser on the devices, bfloat16 vs quantized (counted on the ``meta`` device);
- per-layer relative error of a real-size Wan block's linear layers (random normal(0, 0.02) weights, as
  ``architectures`` builds them): of the weights and of their outputs on random inputs, int8 vs bf16 rounding;
- a real-width Wan layer stack (``--layers`` blocks, random weights) run on JAX: relative L2 error of the
  denoiser output against stock torch float32, for bfloat16, int8 + bfloat16 and int8 + float32.
"""

from __future__ import annotations

import argparse
import json

import diffusers
import jax.numpy as jnp
import numpy as np
import torch

from diffusers_tpu.families import wan
from diffusers_tpu.interop.sharding import keep_in_fp32
from diffusers_tpu.planner import architectures
from diffusers_tpu.runtime.config import TPUConfig
from diffusers_tpu.runtime.files import outputs
from diffusers_tpu.runtime.weights import quantize
from diffusers_tpu.testing import tiny


def weight_bytes(module: torch.nn.Module, fmt: str | None, dtype=torch.bfloat16) -> int:
    """Bytes of ``module``'s parameters on the devices in ``dtype`` (float32 modules kept), quantized or not."""
    keep = getattr(module, "_keep_in_fp32_modules", None) or ()
    names = quantize.targets(module) if fmt else set()
    total = 0
    for name, param in module.named_parameters():
        if name in names:
            total += param.numel() + 4 * param.shape[0]  # 1-byte values + a float32 scale per output channel
        else:
            total += param.numel() * (4 if keep_in_fp32(name, keep) else torch.finfo(dtype).bits // 8)
    return total


def _relative(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm((a - b).ravel()) / np.linalg.norm(b.ravel()))


def layer_errors(block: torch.nn.Module, fmt: str, tokens: int = 256, seed: int = 0) -> dict:
    """Per linear layer of ``block``: relative error of the weights and of ``x @ W.T`` (random ``x``), for the
    quantized weight and for plain bfloat16 rounding, both against float32."""
    rng = np.random.default_rng(seed)
    errors = {}
    for name, module in block.named_modules():
        if not isinstance(module, torch.nn.Linear):
            continue
        w = module.weight.detach().float().numpy()
        values, scale = quantize.quantize_array(jnp.asarray(w), fmt)
        quantized = np.asarray(quantize.dequantize(values, scale, jnp.float32))
        rounded = module.weight.detach().to(torch.bfloat16).float().numpy()
        x = rng.standard_normal((tokens, w.shape[1])).astype(np.float32)
        errors[name] = {
            "weight": _relative(quantized, w),
            "output": _relative(x @ quantized.T, x @ w.T),
            "bf16_weight": _relative(rounded, w),
            "bf16_output": _relative(x @ rounded.T, x @ w.T),
        }
    return errors


def stack_errors(
    layers: int = 4, fmt: str = "int8", frames: int = 3, size: int = 16, text: int = 64, seed: int = 0
) -> dict:
    """Relative L2 error of a real-width Wan2.1-1.3B stack of ``layers`` blocks on JAX vs stock torch float32."""

    config = dict(wan.WAN21_1_3B, num_layers=layers)
    generator = torch.Generator().manual_seed(seed)
    inputs = dict(
        hidden_states=torch.randn(1, config["in_channels"], frames, size, size, generator=generator),
        timestep=torch.tensor([500.0]),
        encoder_hidden_states=torch.randn(1, text, config["text_dim"], generator=generator),
        return_dict=False,
    )

    def fresh():
        transformer = architectures.empty(lambda: diffusers.WanTransformer3DModel(**config))
        architectures.fill_random(transformer, torch.float32, torch.Generator().manual_seed(seed))
        pipe = tiny.wan_pipeline("wan")
        return diffusers.WanPipeline(
            transformer=transformer.eval(),
            vae=pipe.vae,
            text_encoder=pipe.text_encoder,
            tokenizer=pipe.tokenizer,
            scheduler=pipe.scheduler,
        )

    pipe = fresh()
    with torch.no_grad():
        reference = pipe.transformer(**inputs)[0].numpy()
    results = {}
    for label, settings in {
        "bf16": dict(dtype=torch.bfloat16),
        f"{fmt}+bf16": dict(dtype=torch.bfloat16, quantize=fmt),
        f"{fmt}+fp32": dict(quantize=fmt),
    }.items():
        pipe = fresh().to("jax", config=TPUConfig(**settings))
        dtype = settings.get("dtype", torch.float32)  # as the pipeline casts latents and embeddings
        cast = {
            k: v.to(dtype) if isinstance(v, torch.Tensor) and v.is_floating_point() and k != "timestep" else v
            for k, v in inputs.items()
        }
        out = pipe.transformer(**cast)[0].float().numpy()
        results[label] = _relative(out, reference)
        pipe.to("cpu")
    return {"layers": layers, "tokens": frames * (size // 2) ** 2, "relative_l2_vs_fp32": results}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--format", choices=quantize.FORMATS, default="int8")
    parser.add_argument("--layers", type=int, default=4, help="blocks in the real-width stack")
    parser.add_argument("--json", help="also write the report here")
    args = parser.parse_args(argv)
    if args.json:
        outputs.check_destination(args.json, what="--json")
    report = {"format": args.format, "weight_bytes": {}}
    for name in ("Wan2.1-1.3B", "Wan2.1-14B", "CogVideoX1.5-5B"):
        spec = architectures.ARCHITECTURES[name]

        cls = diffusers.WanTransformer3DModel if spec["family"] == "wan" else diffusers.CogVideoXTransformer3DModel
        model = architectures.empty(lambda: cls(**spec["transformer"]))
        report["weight_bytes"][name] = {
            "bf16": weight_bytes(model, None),
            args.format: weight_bytes(model, args.format),
        }

    block = architectures.empty(lambda: diffusers.WanTransformer3DModel(**dict(wan.WAN21_1_3B, num_layers=1)))
    architectures.fill_random(block, torch.float32, torch.Generator().manual_seed(0))
    report["layers_Wan2.1-1.3B_block0"] = layer_errors(block.blocks[0], args.format)
    report["stack"] = stack_errors(args.layers, args.format)
    print(json.dumps(report, indent=1))
    if args.json:
        outputs.write_text(args.json, json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
