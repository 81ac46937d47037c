"""``interop.patching``: the one way the package patches a third-party attribute, and torchax's dispatch stack."""

import types

from diffusers_tpu.interop import patching
from diffusers_tpu.interop.compat import torchax_tensors


def test_wrap_once_stacks_with_labels_and_records():
    owner = types.SimpleNamespace(greet=lambda: "stock")

    def loud(stock):
        return lambda: stock().upper()

    def excited(stock):
        return lambda: stock() + "!"

    assert patching.wrap(owner, "greet", loud, "test: loud")
    assert not patching.wrap(owner, "greet", loud, "test: loud")  # applied already: unchanged
    assert owner.greet() == "STOCK"
    assert patching.wrap(owner, "greet", excited, "test: excited")
    assert not patching.wrap(owner, "greet", loud, "test: loud")  # still in, under another wrapper
    assert owner.greet() == "STOCK!" and patching.labels(owner.greet) == ("test: excited", "test: loud")
    assert {"test: loud", "test: excited"} <= set(patching.applied())


def test_torchax_dispatch_is_wrapped_once_with_every_step_named():
    """One wrapper (one frame per eager op) naming its steps in the declared order; applying again adds nothing."""
    from torchax.tensor import Environment

    torchax_tensors.apply()
    (label,) = patching.labels(Environment.dispatch)
    assert label == "torchax dispatch: " + "; ".join(torchax_tensors.DISPATCH_STEPS)


def test_undo_all_puts_back_what_was_there_and_leaves_what_others_set_since():
    """In a fresh process (undoing here would undo this process's real patches): an added attribute is removed, a
    replaced one restored, one that someone replaced after us keeps theirs; last patch first."""
    from tests.conftest import run_fresh

    report = run_fresh(
        """
        import json, types
        from diffusers_tpu.interop import patching
        owner = types.SimpleNamespace(greet=lambda: "stock")
        stock = owner.greet
        patching.wrap(owner, "greet", lambda s: (lambda: s().upper()), "loud")
        patching.wrap(owner, "greet", lambda s: (lambda: s() + "!"), "excited")
        patching.replace(owner, "added", 1, "added")
        patching.replace(owner, "taken", 2, "taken")
        owner.taken = "theirs"
        undone = patching.undo_all()
        print(json.dumps({"undone": undone, "stock": owner.greet is stock, "added": hasattr(owner, "added"),
                          "taken": owner.taken, "left": patching.applied()}))
        """
    )
    assert report["undone"][:4] == ["taken", "added", "excited", "loud"]  # then what the import itself set
    assert report["stock"] and not report["added"] and report["taken"] == "theirs" and report["left"] == []


def test_temporarily_sets_for_the_block_and_puts_back_even_on_failure():
    class Model:
        def forward(self):
            return "class"

    model, other = Model(), Model()
    other.forward = lambda: "own"
    stock_own = other.forward
    try:
        with patching.temporarily({(model, "forward"): lambda: "stand-in", (other, "forward"): lambda: "stand-in"}):
            assert model.forward() == other.forward() == "stand-in"
            raise KeyError("a probe failed")
    except KeyError:
        pass
    assert "forward" not in vars(model) and model.forward() == "class"  # the class's method again, nothing left over
    assert other.forward is stock_own  # its own previous value restored
    assert patching.touched() == [] or all(owner not in (model, other) for owner, _ in patching.touched())
