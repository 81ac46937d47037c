"""Components shared by pipelines on JAX: diffusers' own idiom ``Img2Img(**pipe.components)``, or a pipeline built
from another's text encoder and transformer.

A placed module belongs to one attached pipeline at a time: its compiled forward and its overrides run in that
pipeline's runtime. Moving a second pipeline that holds it hands it over: the first pipeline goes back to torch on
the host (``detach``) and remembers how it was moved; its next call moves it back the same way, taking the
components back in turn. Results are those of either pipeline alone; the price is that each hand-over moves the
shared weights to the host and back (logged).
"""

from __future__ import annotations

import logging
import weakref

import torch

logger = logging.getLogger(__name__)
# placed module -> a weak reference to the runtime that placed it: a strong one would keep every moved pipeline (its
# device arrays and compiled programs) alive for the life of the process — the runtime holds its modules
_OWNERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_HANDED_OVER = "_diffusers_tpu_handed_over"  # on a pipeline: (target kind, config, dtype) of its last move


def modules_of(pipe) -> dict[str, torch.nn.Module]:
    return {name: m for name, m in pipe.components.items() if isinstance(m, torch.nn.Module)}


def claim(runtime, module: torch.nn.Module):
    """``module`` is ``runtime``'s from now on; the returned function gives it up (``runtime.undo``)."""
    placed_by, module_ref = weakref.ref(runtime), weakref.ref(module)
    _OWNERS[module] = placed_by

    def release():  # holds neither: ``runtime.undo`` keeps it
        placed = module_ref()
        if placed is not None and _OWNERS.get(placed) is placed_by:
            del _OWNERS[placed]

    return release


def owner(module: torch.nn.Module):
    """The runtime that placed ``module`` (None: not on JAX)."""
    placed_by = _OWNERS.get(module)
    return placed_by() if placed_by is not None else None


def other_owners(pipe, runtime) -> list:
    """The attached runtimes, other than ``runtime``, that hold one of ``pipe``'s components."""
    found = []
    for module in modules_of(pipe).values():
        holder = owner(module)
        if holder is not None and holder is not runtime and holder.attached and holder not in found:
            found.append(holder)
    return found


def held_elsewhere(pipe) -> list[str]:
    """``pipe``'s components that another attached pipeline holds on JAX (``pipe`` itself not attached)."""
    holders = {name: owner(module) for name, module in modules_of(pipe).items()}
    return [name for name, holder in holders.items() if holder is not None and holder.pipe is not pipe]


def hand_over(owner, to_pipe, detach) -> None:
    """``owner``'s pipeline gives its components back to torch so that ``to_pipe`` can place the shared ones."""
    shared = [name for name, m in modules_of(owner.pipe).items() if m in set(modules_of(to_pipe).values())]
    logger.warning(
        "%s shares %s with %s on JAX: the components move to the new pipeline (a pipeline holds them one at a time); "
        "calling the %s again takes them back.",
        type(to_pipe).__name__,
        ", ".join(shared),
        type(owner.pipe).__name__,
        type(owner.pipe).__name__,
    )
    how = owner.moved_with
    detach(owner.pipe)
    vars(owner.pipe)[_HANDED_OVER] = how


def how_moved(pipe):
    """``(kind, config, dtype)`` of a pipeline whose components were handed over, else None."""
    return vars(pipe).get(_HANDED_OVER)


def forget(pipe) -> None:
    vars(pipe).pop(_HANDED_OVER, None)
