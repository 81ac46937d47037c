"""The optimisation recipe both trainers share (torch's in ``train``, JAX's in ``train_jax``): one definition, so
the two give the same losses and weights."""

from __future__ import annotations

import math

LEARNING_RATE, WEIGHT_DECAY, CLIP_NORM = 8e-4, 0.01, 1.0
# The saved weights are an exponential moving average of the trained ones: the last steps' noise averages out,
# which is what removes most of the speckle a single step's weights draw.
EMA_DECAY = 0.999


def schedule_factor(step: int, steps: int) -> float:
    """The learning rate's factor at ``step``: linear warm-up, then cosine decay to 10%."""
    warmup = max(1, min(100, steps // 10))
    return min(1.0, (step + 1) / warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / steps)))


def ema_decay(step: int) -> float:
    """The average's decay after update ``step`` (0-based): short at first, so the random start fades quickly."""
    return min(EMA_DECAY, (1 + step) / (10 + step))
