"""The one way this package changes a third-party attribute (torch, torchax, diffusers, peft): ``wrap``.

``wrap(owner, name, make, label)`` looks the current attribute up, returns at once when a wrapper of that label is
already part of it (applying twice changes nothing), sets ``make(current)`` and records the label. Every wrapper
carries the labels of those it wraps, so several patches may stack on one attribute and each still knows whether it
is in. Every patch is recorded with how to undo it: ``undo_all`` puts every attribute back as it was, last patch first
(``diffusers_tpu.deactivate``). Imports nothing of the package."""

from __future__ import annotations

import contextlib
from typing import Callable

_LABELS = "_diffusers_tpu_patches"  # the labels of the wrappers an attribute's current value is made of
_MISSING = object()  # the attribute was not in the owner's own namespace (inherited, or absent)
_applied: list[str] = []
_undo: list[tuple[str, Callable[[], None]]] = []
_touched: dict[tuple[int, str], tuple[object, str]] = {}  # every (owner, name) ever set, kept through ``undo_all``


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
    replace(owner, name, new, label)
    return True


def replace(owner, name: str, value, label: str) -> None:
    """``owner.<name> = value``, recorded with its undo (the owner's own previous value, or none)."""
    previous = vars(owner).get(name, _MISSING)
    setattr(owner, name, value)
    _touched.setdefault((id(owner), name), (owner, name))
    record(label, lambda: _restore(owner, name, value, previous))


def _restore(owner, name: str, value, previous) -> None:
    if vars(owner).get(name, _MISSING) is not value:  # replaced since by someone else: theirs stays
        return
    if previous is _MISSING:
        delattr(owner, name)
    else:
        setattr(owner, name, previous)


@contextlib.contextmanager
def temporarily(changes: dict):
    """``{(owner, name): value}`` set for the block, then put back as ``undo_all`` puts a patch back (the owner's own
    previous value, or none; a value someone replaced since stays theirs): a change that does not outlive the block
    (``plan`` standing in for a pipeline's methods while it probes a call)."""
    undo = []
    try:
        for (owner, name), value in changes.items():
            undo.append((owner, name, value, vars(owner).get(name, _MISSING)))
            setattr(owner, name, value)
        yield
    finally:
        for owner, name, value, previous in reversed(undo):
            _restore(owner, name, value, previous)


class Property(property):
    """A property ``wrap`` can label (a plain ``property`` takes no attributes): what a patch of a property makes."""


def record(label: str, undo: Callable[[], None] | None = None) -> None:
    """A patch applied (by ``wrap``/``replace``, or some other way: an op table entry, a registration), with the
    function that undoes it (None: nothing of it outlives the call that applied it)."""
    if label not in _applied:
        _applied.append(label)
    if undo is not None:
        _undo.append((label, undo))


def undo_all() -> list[str]:
    """Undo every recorded patch, last first; the labels undone. Applying a patch again afterwards re-applies it."""
    undone = []
    while _undo:
        label, undo = _undo.pop()
        undo()
        undone.append(label)
    _applied.clear()
    return undone


def applied() -> list[str]:
    """Every patch applied in this process, in the order applied."""
    return list(_applied)


def touched() -> list[tuple[object, str]]:
    """Every ``(owner, name)`` a patch of this process has set, undone or not (what ``deactivate``'s test compares
    with a process that never imported the package)."""
    return list(_touched.values())
