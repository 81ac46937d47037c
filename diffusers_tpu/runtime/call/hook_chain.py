"""One chain of named hooks around each method of a moved pipeline that users or stock code call: the denoiser's
``forward``, the pipeline's ``encode_prompt`` and host helpers, the VAE's ``encode`` / ``decode``, a compiled
encoder's ``forward``, a host text encoder's ``forward``.

In diffusers' ``HookRegistry`` style: hooks are registered and removed by name, run in one declared order
(``ORDER``, outermost first) whatever order they were registered in, and ``repr`` lists them. Unlike a stack of
wrappers, the chain runs every hook's ``pre_call`` (outermost first), the method, then every ``post_call``
(innermost first) from its own frame: a call meets one frame of it however many hooks it has (the project keeps at
most five of its frames between stock code and a compiled program; ``tests/runtime/test_call_depth.py``).

The hooks, outermost first:

- ``user_entry``: a direct call from user code gets host tensors in and out (``UserEntry``);
- ``cfg_pairing``: the guidance pair's two denoiser calls run as one batch over ``dp``; on ``encode_prompt``, the
  negative embeddings are kept for it (``runtime.call.cfg``);
- ``family``: a family's own step (HunyuanVideo-1.5: its text tokens in the order the program takes them);
- ``on_host``: the method (a pipeline helper, a host text encoder) runs with plain torch on the host
  (``stock_on_host``);
- ``onto_mesh``: a VAE's outputs join the denoiser's mesh (``vae_mesh``);
- ``recording``: the denoiser's output is kept for host callbacks, and a dropped Ctrl-C stops the call here.

Inside them runs the method the chain was installed over: the compiled entry (``runtime.call.denoiser.Denoiser``,
a ``jit.CompiledFunction``), a family's VAE method, or stock code with diffusers' own hooks (a step cache).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable

from ...interop import interrupts, user_tensors, vae_mesh

ORDER = ("user_entry", "cfg_pairing", "family", "on_host", "onto_mesh", "recording")  # outermost first


class Call:
    """One call going through a chain: a hook's ``pre_call`` may replace ``args`` / ``kwargs``, enter contexts on
    ``stack`` (its own: they enclose what is inside the hook and close before its ``post_call``), keep notes, or
    ``answer`` the call."""

    __slots__ = ("args", "kwargs", "stack", "notes", "answered", "output")

    def __init__(self, args, kwargs):
        self.args, self.kwargs, self.stack = args, kwargs, None
        self.notes: dict = {}
        self.answered, self.output = False, None

    def answer(self, output) -> None:
        """The call's output is ``output``: the hooks inside this one and the method do not run."""
        self.answered, self.output = True, output


class Hook:
    """A named step of a chain: ``pre_call(call)`` before what is inside it, ``post_call(call, output)`` after,
    returning what the next hook out sees."""

    name = ""

    def pre_call(self, call: Call) -> None:
        pass

    def post_call(self, call: Call, output):
        return output

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name})"


class HookChain:
    """The hooks around ``owner.<method>``, installed as that attribute (the runtime's ``Overrides`` undo it).
    ``active()``: whether the runtime is attached; when it is not (a wrapper installed over the chain kept it), a
    call runs what was there before."""

    def __init__(self, owner, method: str, active: Callable[[], bool]):
        self.owner, self.method, self._active = owner, method, active
        self.inner = getattr(owner, method)  # what runs inside the hooks
        # stock code reads the method's signature (``inspect.signature(self.transformer.forward)``): the inner one's
        self.__wrapped__, self.__name__ = self.inner, method
        self._before = vars(owner).get(method)  # the instance attribute it replaces, if any
        self.hooks: dict[str, Hook] = {}
        self._ordered: tuple[Hook, ...] = ()

    def __deepcopy__(self, memo):  # a copied module shares it, as it shared the functions this chain replaced
        return self

    def __copy__(self):
        return self

    def register(self, hook: Hook) -> Hook:
        """Add ``hook`` at its place in ``ORDER`` (one hook per name)."""
        if hook.name not in ORDER:
            raise ValueError(f"unknown hook {hook.name!r}; the hooks are {ORDER}")
        if hook.name in self.hooks:
            raise ValueError(f"{self!r} has a {hook.name!r} hook already; remove it first")
        self.hooks[hook.name] = hook
        self._ordered = tuple(sorted(self.hooks.values(), key=lambda h: ORDER.index(h.name)))
        return hook

    def remove(self, name: str) -> Hook:
        hook = self.get(name)
        del self.hooks[name]
        self._ordered = tuple(h for h in self._ordered if h is not hook)
        return hook

    def get(self, name: str) -> Hook:
        """The hook named ``name`` (KeyError naming the registered ones when there is none)."""
        if name not in self.hooks:
            raise KeyError(f"no {name!r} hook on {self!r}")
        return self.hooks[name]

    @property
    def names(self) -> list[str]:
        """The registered hooks' names, outermost first (the order calls meet them)."""
        return [hook.name for hook in self._ordered]

    def __repr__(self) -> str:
        names = " > ".join(self.names)
        inner = getattr(self.inner, "__name__", None) or type(self.inner).__name__
        return f"HookChain({type(self.owner).__name__}.{self.method}: {names} > {inner})"

    def __call__(self, *args, **kwargs):
        if not self._active():
            before = self._before or getattr(type(self.owner), self.method).__get__(self.owner)
            return before(*args, **kwargs)
        call = Call(args, kwargs)
        entered: list[tuple[Hook, contextlib.ExitStack]] = []  # the hooks whose pre_call ran, outermost first
        try:
            for hook in self._ordered:
                call.stack = contextlib.ExitStack()
                entered.append((hook, call.stack))
                hook.pre_call(call)
                if call.answered:
                    break
            else:
                call.output = self.inner(*call.args, **call.kwargs)
            output = call.output
            while entered:  # each hook's contexts close, then its post_call runs: as a ``with`` around the inside
                hook, stack = entered.pop()
                stack.close()
                output = hook.post_call(call, output)
            return output
        except BaseException:
            error = sys.exc_info()
            while entered:
                entered.pop()[1].__exit__(*error)
            raise


class UserEntry(Hook):
    """Outside a pipeline call, tensor inputs may be host tensors and outputs are host tensors (``user_tensors``);
    inside one, JAX tensors pass through. ``scope()``: the runtime's context of a call from outside."""

    name = "user_entry"

    def __init__(self, runtime):
        self.runtime = runtime

    def pre_call(self, call: Call) -> None:
        if self.runtime.inside_call():
            return
        call.stack.enter_context(self.runtime.call_scope())
        call.notes[self.name] = True
        call.args, call.kwargs = user_tensors.to_device(call.args), user_tensors.to_device(call.kwargs)

    def post_call(self, call: Call, output):
        return user_tensors.to_host(output) if call.notes.get(self.name) else output


class Recording(Hook):
    """The denoiser's output kept for the host (``runtime.recorded``); a Ctrl-C Python dropped stops the call here,
    within a step (``interrupts``)."""

    name = "recording"

    def __init__(self, runtime):
        self.runtime = runtime

    def pre_call(self, call: Call) -> None:
        interrupts.raise_if_dropped()

    def post_call(self, call: Call, output):
        self.runtime.recorded = output
        return output


class OntoMesh(Hook):
    """A VAE on its own mesh: what it returns joins the denoiser's mesh (``vae_mesh.onto_mesh``)."""

    name = "onto_mesh"

    def __init__(self, mesh):
        self.mesh = mesh

    def post_call(self, call: Call, output):
        return vae_mesh.onto_mesh(output, self.mesh)
