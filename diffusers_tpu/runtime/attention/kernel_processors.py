"""Stock attention processors swapped, per attention module, for subclasses that run part of their ``__call__``
through the project's kernels (``families.wan_attention``, ``families.cogvideox_attention``).

Only a processor whose class is exactly the stock one is swapped: a user's own processor (a subclass, IP-Adapter's,
a fused one) is kept. The subclass instance shares the stock instance's ``__dict__`` (one state: an attention
backend set on JAX is the stock processor's back on torch), and ``pipe.to("cpu")`` puts the stock instance back
(``runtime.overrides``). Guard: each subclass restates its stock class's ``__call__``, and names the source it restates
by digest (``restates``); where the installed diffusers' source differs (a version that changed it), the stock processor
stays — the same video, without the kernel. diffusers 0.38.0 to 0.42.1 have the same source for all three.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
from collections.abc import Mapping


def source_digest(function) -> str:
    """The first 16 hex digits of the SHA-256 of ``function``'s source."""
    return hashlib.sha256(inspect.getsource(function).encode()).hexdigest()[:16]


def restates(digest: str):
    """Class decorator: the subclass restates its stock base's ``__call__`` whose source digest is ``digest``."""

    def mark(kind: type) -> type:
        kind.restated_digest = digest
        return kind

    return mark


@functools.cache
def still_restated(kind: type) -> bool:
    """Whether the installed diffusers' source of ``kind``'s stock ``__call__`` is the one ``kind`` restates."""
    stock = kind.__mro__[1]
    return source_digest(stock.__call__) == kind.restated_digest


def install(runtime, transformer, processors: Mapping[type, type]) -> int:
    """Give each processor of ``transformer`` whose class is a key of ``processors`` an instance of its value, sharing
    the stock instance's attributes; returns how many were replaced."""
    if transformer is None:
        return 0
    replaced = 0
    for module in transformer.modules():
        processor = getattr(module, "processor", None)
        kind = processors.get(type(processor))
        if kind is None or not still_restated(kind):
            continue
        ours = kind.__new__(kind)
        ours.__dict__ = processor.__dict__
        runtime.overrides.set(module, "processor", ours)
        replaced += 1
    return replaced
