"""Any diffusers transformer pipeline on JAX, without a family file: a family inferred from the module structure.

A pipeline whose denoiser is a diffusers ``ModelMixin`` (components ``transformer``, ``transformer_2``, ...) runs
through the same runtime as the first-class families:

- **Sharding** (``infer_rules``, Megatron-style over ``tp``): in every attention module (diffusers ``Attention`` /
  ``AttentionModuleMixin``: ``to_q``/``to_k``/``to_v`` and the added ``add_*_proj`` context projections) the q/k/v
  projections are column-parallel (output features, i.e. whole heads, over tp) and ``to_out.0`` / ``to_add_out``
  row-parallel; in every ``FeedForward`` the first projection is column-parallel and the last row-parallel. A module
  whose head count tp does not divide, or a weight whose dims it does not divide, stays replicated, as do norms,
  embeddings, modulation tables and small tensors. Block inputs are constrained to (dp, sp). Sharding never changes a
  result (XLA inserts the collectives); it decides speed and memory.
- **Attention** goes through the project's kernel via the SDPA seam every diffusers processor ends in; key-padding
  masks become the kernel's key mask, other masks run the exact reference.
- **Compiled**: the denoiser's forward (one program per input shape), the VAE's ``decoder`` / ``encoder`` modules
  (the Wan VAE and its relatives through their chunked programs); frames and images are quantized on the device.
- **CFG** as stock (two passes where the pipeline makes two): batching the pair over dp needs a family file.

``diffusers_tpu.supported_pipelines()`` lists which pipelines take a family file and which the generic path.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import re

import torch
from diffusers import ModelMixin

from ..runtime.registry import DENOISERS, Family, models_around_a_vae, register_fallback, vae_methods
from . import wan_vae

_COLUMN = ("to_q", "to_k", "to_v", "add_q_proj", "add_k_proj", "add_v_proj")
_ROW = ("to_out.0", "to_add_out")
_BLOCK_LISTS = (
    "blocks",
    "transformer_blocks",
    "single_transformer_blocks",
    "temporal_transformer_blocks",
    "layers",
    "joint_transformer_blocks",
    "video_transformer_blocks",
    "audio_transformer_blocks",
)


def denoiser_names(pipe) -> list[str]:
    return [n for n in DENOISERS if isinstance(getattr(pipe, n, None), ModelMixin)]


def is_attention(module) -> bool:
    return all(isinstance(getattr(module, n, None), torch.nn.Module) for n in ("to_q", "to_k", "to_v")) and (
        isinstance(getattr(module, "heads", None), int)
    )


def is_feed_forward(module) -> bool:
    net = getattr(module, "net", None)
    return (
        type(module).__name__ == "FeedForward"
        and isinstance(net, torch.nn.ModuleList)
        and len(net) >= 3
        and isinstance(getattr(net[0], "proj", None), torch.nn.Linear)
        and isinstance(net[2], torch.nn.Linear)
    )


def _linear_rules(prefix: str, child: str, spec: tuple, module) -> list:
    layer = module.get_submodule(child)
    weight = getattr(layer, "weight", None)
    if not isinstance(weight, torch.Tensor) or weight.ndim != 2:
        return []
    base = re.escape(f"{prefix}{child}")
    rules = [(f"^{base}\\.weight$", spec)]
    if spec[0] is not None and getattr(layer, "bias", None) is not None:
        rules.append((f"^{base}\\.bias$", (spec[0],)))
    return rules


def infer_rules(module: torch.nn.Module, mesh_shape) -> tuple:
    """Sharding rules for ``module`` (see the module docstring); only splits that divide evenly."""
    tp = mesh_shape.get("tp", 1)
    rules = []
    if tp == 1:
        return ()
    for name, sub in module.named_modules():
        prefix = f"{name}." if name else ""
        if is_attention(sub) and sub.heads % tp == 0:
            for child in _COLUMN:
                layer = getattr(sub, child, None)
                if isinstance(layer, torch.nn.Linear) and layer.out_features % tp == 0:
                    rules += _linear_rules(prefix, child, ("tp", None), sub)
            for child in _ROW:
                try:
                    layer = sub.get_submodule(child)
                except AttributeError:
                    continue
                if isinstance(layer, torch.nn.Linear) and layer.in_features % tp == 0:
                    rules += _linear_rules(prefix, child, (None, "tp"), sub)
        elif is_feed_forward(sub):
            first, last = sub.net[0].proj, sub.net[2]
            if first.out_features % tp == 0 and last.in_features % tp == 0:
                rules += _linear_rules(prefix, "net.0.proj", ("tp", None), sub)
                rules += _linear_rules(prefix, "net.2", (None, "tp"), sub)
    return tuple(rules)


def activation_rules(module: torch.nn.Module) -> tuple:
    """Each transformer block's hidden states: batch over dp, tokens over sp."""
    lists = [n for n, m in module.named_children() if n in _BLOCK_LISTS and isinstance(m, torch.nn.ModuleList)]
    return tuple((f"^{re.escape(n)}\\.\\d+$", ("dp", "sp", None)) for n in lists)


def num_heads(pipe) -> int | None:
    """The head count tp must divide: the denoiser's configured heads, else the gcd of its attention modules'."""
    heads = []
    for name in denoiser_names(pipe):
        model = getattr(pipe, name)
        configured = getattr(model.config, "num_attention_heads", None)
        if isinstance(configured, int):
            heads.append(configured)
        else:
            heads += [m.heads for m in model.modules() if is_attention(m)]
    return math.gcd(*heads) if heads else None


def family_for(pipe) -> Family | None:
    """The generic family for ``pipe``, or None when it has no transformer denoiser (a UNet pipeline)."""

    denoisers = denoiser_names(pipe)
    if not denoisers and not _built_without_its_denoiser(pipe) and not models_around_a_vae(type(pipe)):
        return None
    vae = getattr(pipe, "vae", None)
    wan_like = type(vae).__name__ == "AutoencoderKLWan"
    return dataclasses.replace(
        GENERIC,
        pipelines=(type(pipe),),
        denoisers=tuple(denoisers),
        num_heads=num_heads,
        activation_rules=tuple(r for d in denoisers for r in activation_rules(getattr(pipe, d))),
        vae_methods=() if wan_like else vae_methods(vae),
        vae_install=wan_vae.install if wan_like else None,
        vae_programs=wan_vae.PROGRAMS if wan_like else (),
    )


def _built_without_its_denoiser(pipe) -> bool:
    """A transformer or UNet pipeline class built with that component ``None`` (a text-only pipeline for
    ``encode_prompt``, as diffusers' own tests build one): its other components move as the generic path moves them."""
    names = [n for n in inspect.signature(type(pipe).__init__).parameters if n.startswith(("transformer", "unet"))]
    return bool(names) and all(getattr(pipe, name, None) is None for name in names)


GENERIC = Family(name="generic", pipelines=(), rules_for=infer_rules)
register_fallback(family_for)
