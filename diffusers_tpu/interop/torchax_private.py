"""Every private name of torchax the project reads, behind one door: torchax 0.0.13 (its only release; ``CHECKED_ON``)
has no public accessor for these. ``tests/interop/test_private_apis.py`` fails when a release changes one. Patches of
torchax's behaviour, each with its reason and guard, are in ``compat``; they reach torchax through these too.
"""

from __future__ import annotations

import jax

CHECKED_ON = ("0.0.13",)


# A torchax tensor's JAX array (``Tensor._elem``), None for anything else. Why private: ``Tensor.jax()`` reads it but
# a ``View`` answers ``jax()`` by materialising; writing it in place (an in-place op on a held buffer, a placeholder
# refilled) has no public way at all.
def array(tensor) -> jax.Array | None:
    return getattr(tensor, "_elem", None)


def set_array(tensor, value: jax.Array) -> None:
    tensor._elem = value


def holds_array(value) -> bool:
    """Whether ``value`` is a torchax tensor holding its array (not a lazy ``View``, not a torch tensor)."""
    return hasattr(value, "_elem")


def holds_tracer(value) -> bool:
    """Whether ``value`` is a torchax tensor holding a JAX tracer (inside a trace)."""
    return isinstance(getattr(value, "_elem", None), jax.core.Tracer)


def environment_of(tensor):
    """The ``torchax.tensor.Environment`` a torchax tensor or view belongs to (``_env``), None for anything else. Why
    private: no public accessor."""
    return getattr(tensor, "_env", None)


def op_table(environment) -> dict:
    """The environment's table of lowerings keyed by torch callable (``Environment._ops``). Why private: registering
    a lowering for a torch function (not an aten op) has no public API."""
    return environment._ops


def op_or_decomposition(environment, func):
    """The lowering torchax dispatches ``func`` to (``Environment._get_op_or_decomp``)."""
    return environment._get_op_or_decomp(func)


def routes_to_jax(environment, device) -> bool:
    """Whether torchax makes a tensor on ``device`` a JAX one (``Environment._should_use_torchax_tensor``): its own
    decision, read rather than restated, so "jax", "tpu" and the private backend stay as torchax names them."""
    return environment._should_use_torchax_tensor(device)


def dispatch_mode(environment):
    """The torch dispatch mode the environment enters (``Environment._dispatch_mode``)."""
    return environment._dispatch_mode
