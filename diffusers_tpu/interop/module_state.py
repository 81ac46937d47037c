"""State a module keeps on itself between calls, found while its method is traced, carried through the program.

A compiled program replays what one trace did to tensors; what the method did to Python attributes happens only
while tracing. Model code does two such things:

- **caches**: a table computed on first use from shapes and weights (Z-Image's rotary tables). Dropped after the
  trace: the next trace computes it again, and a replay never reads it.
- **state**: a value that depends on the call's inputs and changes what the next call does (EasyAnimate's Magvit
  VAE keeps the last frames of each causal convolution and a flag-like tensor in its temporal upsampler; a counter).
  Replaying the first call's program would silently take the stateless branch again: a wrong video.

``jit`` snapshots every module's attributes (and those of the plain diffusers/transformers objects they hold)
around a trace, and classifies each attribute the trace assigned once, from one more trace:

- a tensor whose value depends on the call's tensor inputs (``depends_on_inputs``, read from that trace's jaxpr) is
  state and is **carried**: its current value is part of the program's key (shape and dtype), it enters the program
  as an input, and the value the method leaves is an output set on the module after each call, as stock torch
  leaves it. A tensor from shapes and weights alone is a cache, dropped after each trace.
- a plain value (a flag, a number, an object) stays as the trace left it: a one-time set-up (transformers'
  output-capturing-hooks flag) is then what stock has after its first call. If the second trace changes it again
  (a counter), no program can serve the next call: the method runs eagerly, op by op, from then on.
- tensors in a container that depend on the inputs cannot be carried either: eagerly too. Eager results are stock's.
"""

from __future__ import annotations

import dataclasses

import torch
from jax.extend import core as jax_core
from torch.nn.modules import module as torch_module

from . import torchax_private
from .torch_private import pytree

MISSING = object()


class Uncarriable(Exception):
    """A carried attribute was left holding a value no program can carry (the method then runs eagerly)."""


@dataclasses.dataclass(frozen=True)
class Eager:
    """State no program can carry: the method runs eagerly from now on. ``keep_result``: the traced call's result
    is stock's (only plain values changed); else the call itself runs again eagerly."""

    reason: str
    keep_result: bool


def settle(program, found: list, inputs: tuple, held: list, caches: set) -> tuple[list, Eager | None]:
    """What a trace assigned (``found``: [(owner, attribute, kind, before)]), classified from one more trace
    (``program.state_dependence``): caches are added to ``caches`` (dropped from now on); returns the state to carry
    ([(place, attribute)], ``held``: the module's places) and, when some state cannot be carried, ``Eager``."""
    pairs = [(owner, attribute) for owner, attribute, *_ in found]
    is_state = program.state_dependence(pairs, *inputs)
    new_state = [
        (owner, attribute) for (owner, attribute, kind, _), yes in zip(found, is_state) if yes and kind == "tensor"
    ]
    eager_state = [entry for entry, yes in zip(found, is_state) if yes and entry[2] != "tensor"]
    caches.update((id(owner), attribute) for (owner, attribute, *_), yes in zip(found, is_state) if not yes)
    if eager_state:  # changed on every call, or tensors in a container: no program carries that
        what = ", ".join(f"{type(owner).__name__}.{attribute}" for owner, attribute, *_ in eager_state)
        if not new_state and all(kind in ("value", "object") for _, _, kind, _ in eager_state):
            return [], Eager(what, keep_result=True)  # the call's result and its plain values are stock's
        restore([(owner, attribute, before) for owner, attribute, _, before in eager_state])
        return [], Eager(what, keep_result=False)
    return [(where(owner, held), attribute) for owner, attribute in new_state], None


def _held(value) -> bool:
    """A plain diffusers/transformers object a module holds (an attention processor, a ``RopeEmbedder``)."""
    return (
        hasattr(value, "__dict__")
        and not isinstance(value, (torch.nn.Module, torch.Tensor, type))
        and type(value).__module__.split(".")[0] in ("diffusers", "transformers")
    )


def owners(module) -> list:
    """Every module in ``module``, and the plain diffusers/transformers objects they hold (``RopeEmbedder``)."""
    found = []
    for sub in module.modules():
        found.append(sub)
        found += [v for v in vars(sub).values() if _held(v)]
    return found


class Place:
    """Where a module holds a plain object: ``holder.<name>``. A pipeline may put another object there between calls
    (SAG and PAG set new attention processors on every call), so what a program carries or was traced with is found
    by its place, not by the object it found there first."""

    def __init__(self, holder, name: str):
        self.holder, self.name = holder, name

    def get(self):
        return vars(self.holder).get(self.name)


def places(module) -> list[Place]:
    """Every place in ``module`` holding a plain diffusers/transformers object."""
    return [Place(sub, name) for sub in module.modules() for name, value in vars(sub).items() if _held(value)]


def where(owner, found: list[Place]):
    """``owner`` itself for a module; the ``Place`` that holds it for a held object (``found``: ``places``)."""
    return next((place for place in found if place.get() is owner), owner)


def current(owner):
    """The object now at an owner's place (``where``)."""
    return owner.get() if isinstance(owner, Place) else owner


def held_key(found: list[Place]) -> tuple:
    """What of the held objects selects the program: each one's class. A processor of another class (PAG's on the
    layers it is applied to) is traced anew; a new one of the same class (SAG's, made on every call) reuses it."""
    return tuple(type(place.get()) for place in found)


_SETTING = (bool, int, float, str)  # not None: a slot filled later (SAG stores its maps) is no setting


# FreeU's factors: ``enable_freeu`` / ``disable_freeu`` set them on each of a UNet's up blocks (which carry a
# ``resolution_idx``), and the blocks' forward reads them at every call.
_FREEU = ("s1", "s2", "b1", "b2")


def setting_owners(modules: list) -> list:
    """The modules whose plain settings select the program (found once: ``settings_key`` reads them at every call):
    those holding an attention processor, and a UNet's up blocks (FreeU's factors)."""
    return [m for m in modules if getattr(m, "processor", None) is not None or hasattr(m, "resolution_idx")]


def settings_key(owners: list) -> tuple:
    """What of the modules' settings selects the program, read at every call: each attention processor's class and
    its plain settings (numbers, strings, flat lists of them), and FreeU's factors on a UNet's up blocks. Python
    values are constants in a trace: IP-Adapter's ``set_ip_adapter_scale`` changes ``processor.scale`` between
    calls, ``fuse_qkv_projections`` swaps the class, ``enable_freeu`` sets the factors; each is traced anew (stock
    reads them at every call). ``owners``: ``setting_owners``."""
    key = []
    for module in owners:
        if hasattr(module, "resolution_idx"):
            key.append(tuple(getattr(module, name, None) for name in _FREEU))
        processor = getattr(module, "processor", None)  # a module processor (IP-Adapter's) is not in vars()
        if processor is None or not hasattr(processor, "__dict__"):
            continue
        settings = tuple(
            (name, tuple(value) if isinstance(value, (list, tuple)) else value)
            for name, value in vars(processor).items()
            if isinstance(value, _SETTING)
            or isinstance(value, (list, tuple))
            and len(value) <= 64
            and all(isinstance(v, _SETTING) for v in value)
        )
        key.append((type(processor), settings))
    return tuple(key)


def hooks(modules: list) -> frozenset:
    """The forward hooks and pre-hooks on ``modules`` (a module's ``modules()``, listed once: this runs at every
    call) and torch's global ones: Python that stock runs at every call (SAG's reads the map size off its UNet's
    middle block; a user's may collect activations), which a compiled program would replay only as its trace saw
    it. This package's own hooks (activation sharding constraints) act while tracing only and are left out."""
    found = [
        hook
        for sub in modules
        for table in (sub._forward_hooks, sub._forward_pre_hooks)
        if table
        for hook in table.values()
    ]
    found += [*torch_module._global_forward_hooks.values(), *torch_module._global_forward_pre_hooks.values()]
    return frozenset(hook for hook in found if not getattr(hook, "__module__", "").startswith("diffusers_tpu."))


def snapshot(module) -> list:
    return [(owner, dict(vars(owner))) for owner in owners(module)]


def changes(before: list, skip: frozenset = frozenset()) -> list[tuple[object, str, object]]:
    """``(owner, name, value before)`` of each attribute assigned a different object since ``before``."""
    found = []
    for owner, old in before:
        current = vars(owner)
        for name in set(old) | set(current):
            if (id(owner), name) not in skip and old.get(name, MISSING) is not current.get(name, MISSING):
                found.append((owner, name, old.get(name, MISSING)))
    return found


def restore(changed: list) -> None:
    for owner, name, value in changed:
        if value is MISSING:
            vars(owner).pop(name, None)
        else:
            setattr(owner, name, value)


def holds_tracer(value) -> bool:
    leaves = pytree.tree_leaves(value) if isinstance(value, (list, tuple, dict)) else [value]
    return any(torchax_private.holds_tracer(x) for x in leaves)


def carriable(value) -> bool:
    """A value a program can carry: a tensor (an input and an output) or a hashable plain value (part of the key)."""
    if isinstance(value, torch.Tensor) or value is MISSING:
        return True
    if holds_tracer(value):
        return False
    try:
        hash(value)
    except TypeError:
        return False
    return True


def kind(value) -> str:
    """What an attribute assigned during a trace holds: "tensor", "container" (tensors inside), "value" (hashable, or
    absent) or "object" (anything else without tensors)."""
    if isinstance(value, torch.Tensor):
        return "tensor"
    if holds_tracer(value):
        return "container"
    return "value" if carriable(value) else "object"


def signature(value):
    """What of a carried value selects the program: a tensor's shape and dtype, a plain value itself."""
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), value.dtype)
    return ("absent",) if value is MISSING else ("value", value)


def depends_on_inputs(closed_jaxpr, inputs: list[bool]) -> list[bool]:
    """For each output of ``closed_jaxpr``: whether it depends on an input flagged in ``inputs`` (conservatively:
    an equation whose inputs depend makes all its outputs depend, sub-programs included)."""
    jaxpr = closed_jaxpr.jaxpr
    reached = {var for var, flagged in zip(jaxpr.invars, inputs) if flagged}
    for equation in jaxpr.eqns:
        if any(not isinstance(var, jax_core.Literal) and var in reached for var in equation.invars):
            reached.update(equation.outvars)
    return [not isinstance(var, jax_core.Literal) and var in reached for var in jaxpr.outvars]
