"""The versions diffusers_tpu is tested with, and one warning at import for any installed version outside them.

``TESTED`` is the version matrix's span (``noxfile.py``, docs/stacks.md); ``setup.cfg`` declares the same specifiers
(``tests/interop/test_versions.py`` keeps the three equal). Standard library only: it runs before torch or JAX load.
"""

from __future__ import annotations

import importlib.metadata
import re
import sys
import warnings

# distribution: the specifier setup.cfg declares (python: python_requires plus the newest interpreter in the matrix)
TESTED = {
    "python": ">=3.11,<3.14",
    "torch": ">=2.13,<2.16",
    "jax": ">=0.10.2,<0.13",
    "torchax": "==0.0.13",
    "diffusers": ">=0.38,<0.43",
    "transformers": ">=4.57,<5.25",
}


class UntestedVersionWarning(UserWarning):
    """An installed dependency's version lies outside the span diffusers_tpu is tested with."""


def release(version: str) -> tuple[int, ...]:
    """The release numbers of a version string: "2.14.1+cu126" -> (2, 14, 1), "5.24.0.dev0" -> (5, 24, 0)."""
    found = re.match(r"\d+(?:\.\d+)*", version)
    if found is None:
        raise ValueError(f"not a version: {version!r}")
    return tuple(int(part) for part in found.group().split("."))


def _padded(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    width = max(len(a), len(b))
    return a + (0,) * (width - len(a)), b + (0,) * (width - len(b))


def satisfies(version: str, specifier: str) -> bool:
    """Whether ``version`` meets every clause of ``specifier`` (clauses ``>=``, ``<``, ``==``, comma-separated)."""
    for clause in specifier.split(","):
        operator, bound = re.fullmatch(r"\s*(>=|<|==)\s*([\w.]+)\s*", clause).groups()
        have, need = _padded(release(version), release(bound))
        if not {">=": have >= need, "<": have < need, "==": have == need}[operator]:
            return False
    return True


def installed() -> dict[str, str | None]:
    """The installed version of each tested distribution (None: not installed)."""
    found = {"python": ".".join(map(str, sys.version_info[:3]))}
    for name in TESTED:
        if name != "python":
            try:
                found[name] = importlib.metadata.version(name)
            except importlib.metadata.PackageNotFoundError:
                found[name] = None
    return found


def outside(versions: dict[str, str | None] | None = None) -> list[str]:
    """Each installed version outside ``TESTED``, as "torch 2.12.0 (tested: >=2.13,<2.16)"."""
    versions = installed() if versions is None else versions
    return [
        f"{name} {version} (tested: {TESTED[name]})"
        for name, version in versions.items()
        if version is not None and not satisfies(version, TESTED[name])
    ]


def warn_outside(versions: dict[str, str | None] | None = None) -> bool:
    """One ``UntestedVersionWarning`` naming every version outside the tested span; silence inside. Returns whether it
    warned."""
    found = outside(versions)
    if found:
        warnings.warn(
            "diffusers_tpu is tested with other versions than these: "
            + "; ".join(found)
            + ". It may work; results are not checked against stock there (docs/stacks.md lists the tested stacks).",
            UntestedVersionWarning,
            stacklevel=3,
        )
    return bool(found)
