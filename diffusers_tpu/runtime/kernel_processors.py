"""Stock attention processors swapped, per attention module, for subclasses that run part of their ``__call__``
through the project's kernels (``families.wan_attention``, ``families.cogvideox_attention``).

Only a processor whose class is exactly the stock one is swapped: a user's own processor (a subclass, IP-Adapter's,
a fused one) is kept. The subclass instance shares the stock instance's ``__dict__`` (one state: an attention
backend set on JAX is the stock processor's back on torch), and ``pipe.to("cpu")`` puts the stock instance back
(``runtime.overrides``). Guard: the subclasses restate diffusers 0.42's code (``registry.TESTED_DIFFUSERS``); other
versions keep the stock processors.
"""

from __future__ import annotations

from collections.abc import Mapping

from .registry import diffusers_tested


def install(runtime, transformer, processors: Mapping[type, type]) -> int:
    """Give each processor of ``transformer`` whose class is a key of ``processors`` an instance of its value, sharing
    the stock instance's attributes; returns how many were replaced."""
    if transformer is None or not diffusers_tested():
        return 0
    replaced = 0
    for module in transformer.modules():
        processor = getattr(module, "processor", None)
        kind = processors.get(type(processor))
        if kind is None:
            continue
        ours = kind.__new__(kind)
        ours.__dict__ = processor.__dict__
        runtime.overrides.set(module, "processor", ours)
        replaced += 1
    return replaced
