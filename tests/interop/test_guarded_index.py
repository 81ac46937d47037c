"""``GuardedIndex``: a step counter whose Python decisions are recorded, so a later step that answers them alike can run
the same program; every other use is answered exactly and guarded by equality."""

from diffusers_tpu.interop.guarded_index import GuardedIndex, Guards


def counter(value: int) -> tuple[GuardedIndex, Guards]:
    guards = Guards()
    return GuardedIndex.start(value, lambda: "base input", guards), guards


def test_uniPC_like_decisions_hold_for_the_middle_steps_only():
    index, guards = counter(5)
    order = min(2, 20 - index)  # lower_order_final's min: (20 - i) < 2 recorded
    use_corrector = index > 0 and (index - 1) not in [3, 7]
    assert order == 2 and use_corrector
    assert [guards.hold(i) for i in (0, 1, 4, 5, 6, 8, 18, 19)] == [False, True, False, True, True, False, True, False]


def test_affine_arithmetic_stays_symbolic():
    index, guards = counter(5)
    following = index + 1
    back = 20 - index
    assert (following.value, following.coef, following.offset) == (6, 1, 1)
    assert (back.value, back.coef, back.offset) == (15, -1, 20)
    assert (-back).value == -15 and (following - 3).value == 3 and (3 + index).value == 8
    assert guards.checks == []  # nothing decided yet: every step can share the program


def test_every_other_use_is_exact_and_guarded_by_equality():
    for use in (lambda i: [10, 11, 12, 13, 14, 15, 16][i], lambda i: i * 2, lambda i: hash(i), lambda i: str(i)):
        index, guards = counter(5)
        use(index)
        assert guards.hold(5) and not guards.hold(6)


def test_truth_and_none_checks():
    index, guards = counter(0)
    assert index is not None
    assert not index  # bool: recorded as == 0
    assert guards.hold(0) and not guards.hold(3)
