"""The ledger of what a runtime changed on the user's objects, so that ``pipe.to("cpu")`` puts every one back.

Each entry is undone in reverse order. ``set`` replaces an attribute of an object (a module's ``forward``, a
pipeline's ``encode_prompt``) and records how to restore it exactly: the instance attribute that was there, or none.
A ``forward`` function set this way is guarded: after ``undo_all`` it calls what was there before, so a diffusers hook
registered on top of ours meanwhile (``HookRegistry`` wraps ``forward``) keeps working, and undoing leaves that hook in
place. Other attributes are not wrapped (a guard is one more frame on every call; ``hook_chain.HookChain`` guards
itself)."""

from __future__ import annotations

import functools
import types
from typing import Callable

_FUNCTIONS = (types.FunctionType, types.MethodType, functools.partial)


class Overrides:
    """What is changed while ``attached()`` (the runtime is attached), and the steps that undo it."""

    def __init__(self, attached: Callable[[], bool]):
        self._attached = attached
        self._entries: list[tuple[str, Callable[[], None]]] = []

    def set(self, owner, name: str, value) -> None:
        """Set ``owner.<name>`` (bypassing ``__setattr__``: torch modules would register a module) until undone."""
        had = name in vars(owner)
        previous = vars(owner).get(name)
        if name == "forward" and isinstance(value, _FUNCTIONS):
            value = self._guarded(owner, name, value, previous if had else None)
        object.__setattr__(owner, name, value)

        def undo():
            if vars(owner).get(name) is not value:
                return  # replaced on top of ours: ours (guarded) now falls through
            if had:
                object.__setattr__(owner, name, previous)
            else:
                vars(owner).pop(name, None)

        self._entries.append((f"{type(owner).__name__}.{name}", undo))

    def add_undo(self, step: Callable[[], None], what: str | None = None) -> None:
        """A change made elsewhere (a module's weights placed, a hook registered): ``step`` undoes it."""
        self._entries.append((what or _describe(step), step))

    def undo_all(self) -> None:
        """Every step, the latest first; the ledger is empty afterwards."""
        entries, self._entries = self._entries, []
        for _, step in reversed(entries):
            step()

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        lines = "".join(f"\n  {what}" for what, _ in self._entries)
        return f"Overrides({len(self._entries)}){lines}"

    def _guarded(self, owner, name, value, previous):
        @functools.wraps(value)
        def guarded(*args, **kwargs):
            if self._attached():
                return value(*args, **kwargs)
            fallback = previous if previous is not None else getattr(type(owner), name).__get__(owner)
            return fallback(*args, **kwargs)

        guarded.__wrapped__ = value
        return guarded


def _describe(step) -> str:
    if isinstance(step, functools.partial):
        return f"{_describe(step.func)}({', '.join(type(arg).__name__ for arg in step.args)})"
    owner = getattr(step, "__self__", None)
    name = getattr(step, "__qualname__", None) or type(step).__name__
    return f"{type(owner).__name__}.{step.__name__}" if owner is not None and hasattr(step, "__name__") else name
