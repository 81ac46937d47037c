"""A step counter traced into a program without fixing it: ``GuardedIndex`` and the ``Guards`` it records.

A scheduler's ``step`` reads ``self.step_index`` twice over: to index its tables (``self.sigmas[self.step_index]``)
and to branch in Python (``if self.step_index > 0``, ``min(order, len(self.timesteps) - self.step_index)``). Traced as a
plain int, every step is a program of its own. Traced as a ``GuardedIndex``, an index into a tensor becomes the
program's input (``traced``: the counter is an argument), and every Python decision made on it is answered with the
concrete value and recorded as a guard. A later step whose counter answers every guard the same way takes the same
path through the Python code, so it runs the same program with its own counter: UniPC's 20 steps are 4 programs (the
first, the second, the middle ones, the last), FlowMatchEuler's 1.

The counter is an affine function of the step's input, ``coef * base + offset`` (``self._step_index + 1``,
``len(self.timesteps) - self.step_index``); a use that is not (a product, a hash, a list index, a string) is answered
exactly and guarded by equality, so it is always correct and at worst specific to that step. Standard library only.
"""

from __future__ import annotations

import operator
from collections.abc import Callable

_COMPARISONS = {"==": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le, ">": operator.gt}
_COMPARISONS[">="] = operator.ge


class Guards:
    """The decisions a trace made on its counter: (coef, offset, comparison, other, answer)."""

    def __init__(self):
        self.checks: list[tuple[int, int, str, int, bool]] = []

    def record(self, coef: int, offset: int, comparison: str, other: int, answer: bool) -> bool:
        self.checks.append((coef, offset, comparison, other, answer))
        return answer

    def hold(self, base: int) -> bool:
        """Whether a counter starting at ``base`` answers every decision as the trace's did."""
        return all(
            _COMPARISONS[c](coef * base + offset, other) is answer for coef, offset, c, other, answer in self.checks
        )


class GuardedIndex:
    """``coef * base + offset``: concretely ``value``; in the program ``traced()`` (from the base's input)."""

    __slots__ = ("value", "coef", "offset", "base", "guards")

    def __init__(self, value: int, coef: int, offset: int, base: Callable, guards: Guards):
        self.value, self.coef, self.offset, self.base, self.guards = value, coef, offset, base, guards

    @classmethod
    def start(cls, value: int, base: Callable, guards: Guards) -> GuardedIndex:
        """The counter at the step's start: ``base()`` is its traced input."""
        return cls(value, 1, 0, base, guards)

    def traced(self):
        """The counter in the program (an int32 array: the base input, scaled and shifted)."""
        return self.base() * self.coef + self.offset

    def _derived(self, coef: int, offset: int) -> GuardedIndex:
        base_value = (self.value - self.offset) * self.coef  # coef is +1 or -1: its own inverse
        return GuardedIndex(coef * base_value + offset, coef, offset, self.base, self.guards)

    def exact(self) -> int:
        """The concrete value, guarded by equality (every use that is not affine or a comparison)."""
        self._guard("==", self.value)
        return self.value

    def _guard(self, comparison: str, other: int) -> bool:
        return self.guards.record(
            self.coef, self.offset, comparison, other, _COMPARISONS[comparison](self.value, other)
        )

    # affine arithmetic with plain ints stays symbolic
    def __add__(self, other):
        if _plain_int(other):
            return self._derived(self.coef, self.offset + other)
        return self.exact() + _exact(other)

    __radd__ = __add__

    def __sub__(self, other):
        if _plain_int(other):
            return self._derived(self.coef, self.offset - other)
        return self.exact() - _exact(other)

    def __rsub__(self, other):
        if _plain_int(other):
            return self._derived(-self.coef, other - self.offset)
        return _exact(other) - self.exact()

    def __neg__(self):
        return self._derived(-self.coef, -self.offset)

    def __pos__(self):
        return self

    # comparisons with plain ints answer concretely and are recorded
    def _compare(self, comparison: str, other):
        if _plain_int(other):
            return self._guard(comparison, other)
        if other is None or not isinstance(other, (int, float, GuardedIndex)):
            return NotImplemented
        return _COMPARISONS[comparison](self.exact(), _exact(other))

    def __eq__(self, other):
        return self._compare("==", other)

    def __ne__(self, other):
        result = self._compare("==", other)
        return result if result is NotImplemented else not result

    def __lt__(self, other):
        return self._compare("<", other)

    def __le__(self, other):
        return self._compare("<=", other)

    def __gt__(self, other):
        return self._compare(">", other)

    def __ge__(self, other):
        return self._compare(">=", other)

    def __bool__(self):
        return not self._guard("==", 0)

    # every other use: the exact value
    def __index__(self):
        return self.exact()

    __int__ = __index__

    def __float__(self):
        return float(self.exact())

    def __hash__(self):
        return hash(self.exact())

    def __repr__(self):
        return repr(self.exact())

    __str__ = __repr__

    def __format__(self, spec):
        return format(self.exact(), spec)

    def __mul__(self, other):
        return self.exact() * _exact(other)

    __rmul__ = __mul__

    def __floordiv__(self, other):
        return self.exact() // _exact(other)

    def __rfloordiv__(self, other):
        return _exact(other) // self.exact()

    def __truediv__(self, other):
        return self.exact() / _exact(other)

    def __rtruediv__(self, other):
        return _exact(other) / self.exact()

    def __mod__(self, other):
        return self.exact() % _exact(other)

    def __rmod__(self, other):
        return _exact(other) % self.exact()

    def __pow__(self, other):
        return self.exact() ** _exact(other)

    def __abs__(self):
        return abs(self.exact())


def _plain_int(value) -> bool:
    return type(value) is int


def _exact(value):
    return value.exact() if isinstance(value, GuardedIndex) else value
