"""The demo's training step on JAX: the stock transformer's torch code traced through torchax, differentiated by JAX.

    python -m diffusers_tpu.demo.train --output DIR --platform jax

The same batches, schedule, AdamW and gradient clipping as the torch step (``demo.train``), written in ``jax.numpy``
after torch's definitions, so the two start on the same losses (test). Not bit for bit: the platforms round
differently, so a full run ends on other weights than the shipped ones. One jitted program serves every step.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import torch
from torch.func import functional_call

from ..interop import backend
from ..interop.compat import torch_itself
from .recipe import CLIP_NORM, LEARNING_RATE, WEIGHT_DECAY, ema_decay, schedule_factor

BETAS, EPSILON = (0.9, 0.999), 1e-8  # torch.optim.AdamW's defaults


def jax_steps(transformer, steps: int, learning_rate: float = LEARNING_RATE):
    """``(step, averaged)`` as ``demo.train.train`` takes them: ``step`` updates JAX copies of the weights and their
    moving average, ``averaged`` returns host (torch) copies of the average."""
    params = {name: backend.to_jax_array(p.detach()) for name, p in transformer.named_parameters()}
    moments = ({k: jnp.zeros_like(v) for k, v in params.items()}, {k: jnp.zeros_like(v) for k, v in params.items()})

    def loss_of(weights, noisy, sigma, context, target):
        token = torch_itself.tracing.set(True)  # library code takes its compile-friendly paths, as in every program
        try:
            with backend.jax_mode(), torch.no_grad():
                wrapped = {k: backend.wrap(v) for k, v in weights.items()}
                out = functional_call(
                    transformer,
                    wrapped,
                    (backend.wrap(noisy),),
                    dict(
                        timestep=backend.wrap(sigma * 1000),
                        encoder_hidden_states=backend.wrap(context),
                        return_dict=False,
                    ),
                )[0]
        finally:
            torch_itself.tracing.reset(token)
        return jnp.mean((backend.to_jax_array(out) - target) ** 2)

    @jax.jit
    def update(weights, moments, average, count, lr, decay, noisy, sigma, context, target):
        loss, grads = jax.value_and_grad(loss_of)(weights, noisy, sigma, context, target)
        norm = jnp.sqrt(sum(jnp.sum(g * g) for g in grads.values()))
        grads = {k: g * jnp.minimum(1.0, CLIP_NORM / (norm + 1e-6)) for k, g in grads.items()}  # clip_grad_norm_
        first = {k: BETAS[0] * moments[0][k] + (1 - BETAS[0]) * g for k, g in grads.items()}
        second = {k: BETAS[1] * moments[1][k] + (1 - BETAS[1]) * g * g for k, g in grads.items()}
        correction1, correction2 = 1 - BETAS[0] ** count, 1 - BETAS[1] ** count
        new = {
            k: w * (1 - lr * WEIGHT_DECAY)
            - lr / correction1 * first[k] / (jnp.sqrt(second[k]) / jnp.sqrt(correction2) + EPSILON)
            for k, w in weights.items()
        }
        average = {k: decay * average[k] + (1 - decay) * w for k, w in new.items()}
        return new, (first, second), average, loss

    state = {"params": params, "moments": moments, "average": dict(params)}

    def step(index, noisy, sigma, context, target) -> float:
        lr = learning_rate * schedule_factor(index, steps)
        arrays = [backend.to_jax_array(t) for t in (noisy, sigma, context, target)]
        count = jnp.asarray(index + 1, jnp.float32)  # an argument, not a constant: one program for every step
        state["params"], state["moments"], state["average"], loss = update(
            state["params"], state["moments"], state["average"], count, lr, ema_decay(index), *arrays
        )
        return float(loss)

    def averaged():
        return {name: torch.from_numpy(np.array(a)) for name, a in state["average"].items()}  # writable host copies

    return step, averaged
