"""The versions diffusers_tpu is tested with, and one warning at import for any installed version outside them.

``TESTED`` is the version matrix's span (``noxfile.py``, docs/stacks.md); ``setup.cfg`` declares its lower bounds and
no upper bound but for a known incompatibility (``tests/interop/test_versions.py``). Standard library only: it runs
before torch or JAX load.
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
    "transformers": ">=4.57,<5.26",
    "torch-tpu": ">=0.2,<0.3",  # beside it: the ``torchtpu`` extra, ``interop.compat.shared_device``
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
    """Whether ``version`` meets every clause of ``specifier`` (clauses ``>=``, ``<=``, ``>``, ``<``, ``==``,
    comma-separated)."""
    for clause in specifier.split(","):
        operator, bound = re.fullmatch(r"\s*(>=|<=|==|<|>)\s*([\w.]+)\s*", clause).groups()
        have, need = _padded(release(version), release(bound))
        met = {">=": have >= need, "<=": have <= need, ">": have > need, "<": have < need, "==": have == need}
        if not met[operator]:
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


class BrokenCombinationWarning(UserWarning):
    """Installed packages that cannot work together (one's requirement on another unmet)."""


# Beside TorchTPU its libtpu serves JAX too; the ``tpu`` extra on Python 3.11 (jax[tpu] 0.10.2) pins libtpu 0.0.42.1,
# which pip installs over TorchTPU's (it needs >=0.0.50) and TorchTPU cannot start with. JAX 0.10.2 compiles with
# either (docs/stacks.md), so the fix is TorchTPU's libtpu again.
def torchtpu_libtpu_unmet() -> str | None:
    """A one-line fix when torch-tpu's requirement on libtpu is unmet, else None."""
    try:
        required = importlib.metadata.requires("torch-tpu") or []
        have = importlib.metadata.version("libtpu")
    except importlib.metadata.PackageNotFoundError:
        return None
    for requirement in required:
        found = re.fullmatch(r"libtpu\s*\(?\s*([<>=][^;)]*?)\s*\)?\s*(;.*)?", requirement.strip())
        if found and not satisfies(have, found.group(1)):
            return (
                f"TorchTPU (torch-tpu) needs libtpu{found.group(1)}, but libtpu {have} is installed (jax[tpu]'s pin: "
                f"the [tpu] extra on Python 3.11), so TorchTPU cannot start; pip install 'libtpu{found.group(1)}' "
                "gives it back (JAX uses it too), and beside TorchTPU install diffusers-tpu[torchtpu], not [tpu]."
            )
    return None


def warn_broken() -> bool:
    """One ``BrokenCombinationWarning`` for a combination of installed packages that cannot work; whether it warned."""
    found = torchtpu_libtpu_unmet()
    if found:
        warnings.warn(found, BrokenCombinationWarning, stacklevel=3)
    return bool(found)
