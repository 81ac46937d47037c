"""The layers wrapped around a placed denoiser's ``forward``: declared once in their order, each named, listed by a
``repr`` and found by name (as ``compat.DISPATCH_LAYERS`` declares torchax's dispatch layers, and diffusers'
``HookRegistry`` its hooks).

Innermost first, what a call meets from the outside in is the reverse:

- ``program``: the compiled entry (``runtime.denoiser.Denoiser``) — the compiled program, or compiled units while
  diffusers hooks (step caches) are registered; installed inside diffusers' hook chain when there is one;
- ``recording``: keeps the call's output (what ``pipe.to`` hands a host callback between steps);
- ``family``: a family's own wrapper (HunyuanVideo-1.5: its text tokens in the order the program takes them);
- ``cfg_pairing``: the guidance pair's two calls run as one batch over ``dp`` (``runtime.cfg``);
- ``user_entry``: host tensors in and out for a direct call outside a pipeline call.

Each layer is installed through the runtime's ``Overrides`` (undone by ``pipe.to("cpu")``); a layer added out of
the declared order is a bug and raises.
"""

from __future__ import annotations

from collections.abc import Callable

from .. import diffusers_private

LAYERS = ("program", "recording", "family", "cfg_pairing", "user_entry")  # innermost first


class ForwardChain:
    """One denoiser's installed layers (module docstring)."""

    def __init__(self, module, overrides):
        self.module, self.overrides = module, overrides
        self.installed: dict[str, object] = {}  # name -> the callable that layer installed, innermost first

    def add(self, name: str, wrap: Callable, install: Callable | None = None):
        """Install layer ``name``: ``wrap(inner forward) -> forward``; ``install(forward)`` places it when it goes
        somewhere else than the instance's ``forward`` (the program inside a diffusers hook chain)."""
        if name not in LAYERS:
            raise ValueError(f"unknown denoiser layer {name!r}; the layers are {LAYERS}")
        if name in self.installed or any(LAYERS.index(other) > LAYERS.index(name) for other in self.installed):
            raise RuntimeError(f"layer {name!r} added out of the declared order {LAYERS}: {self!r}")
        forward = wrap(self.module.forward)
        if install is not None:
            install(forward)
        else:
            self.overrides.set(self.module, "forward", forward)
            forward = vars(self.module)["forward"]  # as installed (the ledger's guard around it)
        self.installed[name] = forward
        return forward

    def get(self, name: str):
        """The callable layer ``name`` installed (KeyError naming the installed ones when it has none)."""
        if name not in self.installed:
            raise KeyError(f"no {name!r} layer on {self!r}")
        return self.installed[name]

    def __repr__(self) -> str:
        hooks = diffusers_private.hook_names(self.module)
        inside = f" [diffusers hooks: {', '.join(hooks)}]" if hooks else ""
        layers = " > ".join(reversed(list(self.installed)))
        return f"ForwardChain({type(self.module).__name__}: {layers}{inside})"
