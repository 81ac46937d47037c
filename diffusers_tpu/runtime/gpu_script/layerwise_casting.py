"""``transformer.enable_layerwise_casting(storage_dtype=torch.float8_e4m3fn, compute_dtype=torch.bfloat16)`` on a
denoiser that is on JAX: the weights diffusers would cast are stored on the devices in the storage dtype and cast to
the compute dtype inside each compiled program, where the layer reads them — stock's per-layer hooks do the same cast
around each layer's forward. Which layers: exactly the ones stock picks (its own selection runs, its hook install
replaced by a list; diffusers 0.42's ``hooks.layerwise_casting``). Back on torch (``pipe.to("cpu")``) the module
holds its storage-dtype weights and stock's hooks, as if the call had run there.
"""

from __future__ import annotations

import contextlib

import torch
from diffusers.hooks import layerwise_casting as stock_casting

from ...interop import sharding


@contextlib.contextmanager
def _collecting(chosen: list):
    """Stock's selection with its hook install replaced by ``chosen.append`` (and peft's input-autocast hooks
    skipped): the layers and dtypes it would cast, nothing changed. Guard: diffusers' module functions by name."""
    install, peft = stock_casting.apply_layerwise_casting_hook, stock_casting._disable_peft_input_autocast
    stock_casting.apply_layerwise_casting_hook = lambda module, storage, compute, non_blocking: chosen.append(
        (module, storage, compute)
    )
    stock_casting._disable_peft_input_autocast = lambda module: None
    try:
        yield
    finally:
        stock_casting.apply_layerwise_casting_hook, stock_casting._disable_peft_input_autocast = install, peft


def enable(runtime, module: torch.nn.Module, stock, args, kwargs) -> None:
    """``module.enable_layerwise_casting(*args, **kwargs)`` for a placed module of ``runtime``."""
    name = next((n for n, (m, _, _) in runtime.decision.plans.items() if m is module), None)
    if name not in runtime.family.denoisers:
        raise ValueError(
            f"enable_layerwise_casting on {type(module).__name__}, which is on JAX but not the pipeline's denoiser: "
            "on JAX only the denoiser stores its weights narrower (or use TPUConfig(dtype=...) / component_dtypes)."
        )
    if runtime.config.quantize is not None:
        raise ValueError(
            "enable_layerwise_casting on a denoiser already stored quantized (TPUConfig(quantize=...)): choose one "
            "of the two."
        )
    chosen: list = []
    with _collecting(chosen):
        stock(module, *args, **kwargs)
    layers = {id(layer): (storage, compute) for layer, storage, compute in chosen}
    sharding.restore(module)  # placed again below with the storage dtype
    for slot in runtime.decision.plans[name][1]:
        dtypes = layers.get(id(slot.owner))
        if dtypes is not None and sharding.tensor_of(slot).is_floating_point():
            slot.dtype = slot.restore_dtype = dtypes[0]
            slot.compute = dtypes[1]
    runtime.put_on_devices(name)

    def back_on_torch():  # stock's hooks on the storage-dtype weights
        sharding.restore(module)
        stock(module, *args, **kwargs)

    runtime.overrides.add_undo(back_on_torch, f"{type(module).__name__} layerwise casting")
