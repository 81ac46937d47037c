"""Every private name of diffusers the project uses, behind one door: each entry says why no public API serves and was
checked on diffusers 0.38.0 and 0.42.1 (``CHECKED_ON``); ``tests/runtime/test_diffusers_private.py`` fails when a
release changes one. Where diffusers has a public way it is used instead (``attention_backend``)."""

from __future__ import annotations

import contextlib

import diffusers
from diffusers.models import attention_dispatch

CHECKED_ON = ("0.38.0", "0.42.1")
NATIVE = attention_dispatch.AttentionBackendName.NATIVE


def hook_registry(module):
    """The ``HookRegistry`` diffusers keeps on ``module`` (its ``_diffusers_hook`` attribute), or None. Why private:
    the public ``HookRegistry.check_if_exists_or_initialize`` creates one where there is none; reading must not."""
    return getattr(module, "_diffusers_hook", None)


def hook_names(module) -> list[str]:
    """The names of the hooks registered on ``module`` itself, outermost last (none: [])."""
    registry = hook_registry(module)
    return list(registry.hooks) if registry is not None else []


def innermost_forward_reference(module):
    """Where a hook chain on ``module`` keeps the module's own forward: (function reference object, attribute name), or
    None without hooks. Why private: ``HookRegistry._fn_refs[0]`` is the only handle on the end of the chain; the
    runtime installs the compiled denoiser there, so the hooks run around it (``runtime.denoiser``)."""
    registry = hook_registry(module)
    if registry is None or not registry.hooks:
        return None
    reference = registry._fn_refs[0]
    return reference, "original_forward" if reference.original_forward is not None else "forward"


def active_attention_backend() -> attention_dispatch.AttentionBackendName:
    """The backend diffusers' attention dispatch uses now (set by ``diffusers.attention_backend(...)`` or
    ``set_attention_backend``). Why private: ``_AttentionBackendRegistry.get_active_backend`` is the only reader."""
    return attention_dispatch._AttentionBackendRegistry.get_active_backend()[0]


def native_attention():
    """The public ``diffusers.attention_backend("native")`` context: inside JAX calls the dispatch takes SDPA, which
    the project routes to its kernel."""
    return diffusers.attention_backend(NATIVE)


@contextlib.contextmanager
def serving_backend(name: attention_dispatch.AttentionBackendName, function):
    """diffusers' dispatch serves backend ``name`` with ``function`` for the duration. Why private: the registry has no
    public way to replace a registered backend's function (``_AttentionBackendRegistry._backends``); the ``flex``
    backend's torch function cannot run on JAX (``runtime.flex_attention``)."""
    backends = attention_dispatch._AttentionBackendRegistry._backends
    stock = backends.get(name)
    backends[name] = function
    try:
        yield
    finally:
        backends[name] = stock
