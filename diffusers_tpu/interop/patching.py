"""The one way this package changes a third-party attribute (torch, torchax, diffusers, peft): ``wrap``.

``wrap(owner, name, make, label)`` looks the current attribute up, returns at once when a wrapper of that label is
already part of it (applying twice changes nothing), sets ``make(current)`` and records the label. Every wrapper
carries the labels of those it wraps, so several patches may stack on one attribute (torchax's
``Environment.dispatch`` holds four, in the order ``compat.DISPATCH_LAYERS`` names) and each still knows whether it is
in. Imports nothing of the package."""

from __future__ import annotations

from typing import Callable

_LABELS = "_diffusers_tpu_patches"  # the labels of the wrappers an attribute's current value is made of
_applied: list[str] = []


def labels(value) -> tuple[str, ...]:
    """The patches ``value`` (an attribute's current value) is made of, outermost first."""
    return getattr(value, _LABELS, ())


def wrap(owner, name: str, make: Callable, label: str) -> bool:
    """``owner.<name> = make(current)`` unless a wrapper labelled ``label`` is already in it; whether it was set."""
    current = getattr(owner, name, None)
    if label in labels(current):
        return False
    new = make(current)
    setattr(new, _LABELS, (label, *labels(current)))
    setattr(owner, name, new)
    record(label)
    return True


def record(label: str) -> None:
    """A patch applied some other way (one that adds a missing attribute, or sets several at once)."""
    if label not in _applied:
        _applied.append(label)


def applied() -> list[str]:
    """Every patch applied in this process, in the order applied."""
    return list(_applied)
