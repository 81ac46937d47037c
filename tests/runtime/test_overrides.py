"""``runtime.overrides.Overrides``: the ledger ``pipe.to("cpu")``'s exact restoration depends on."""

import torch

from diffusers_tpu.runtime.attach.overrides import Overrides


class Box:
    def greet(self):
        return "stock"


def test_set_and_undo_all_restore_exactly_and_in_reverse():
    state = {"active": True}
    ledger, box, module = Overrides(lambda: state["active"]), Box(), torch.nn.Linear(2, 2)
    box.own = "mine"
    ledger.set(box, "own", "theirs")  # an instance attribute that was there
    ledger.set(box, "greet", lambda: "ours")  # none was: the class's method shows through again
    ledger.set(module, "forward", lambda x: x)  # a module: no submodule registered, no __setattr__ logic
    order = []
    ledger.add_undo(lambda: order.append("first"), "first step")
    ledger.add_undo(lambda: order.append("second"))
    assert (box.own, box.greet(), len(ledger)) == ("theirs", "ours", 5)
    text = repr(ledger)
    assert text.startswith("Overrides(5)") and "Box.own" in text and "Box.greet" in text and "Linear.forward" in text
    assert "first step" in text
    ledger.undo_all()
    assert order == ["second", "first"]
    assert box.own == "mine" and "greet" not in vars(box) and box.greet() == "stock"
    assert "forward" not in vars(module) and len(ledger) == 0 and repr(ledger) == "Overrides(0)"
    ledger.undo_all()  # nothing left: a second detach is harmless
    assert order == ["second", "first"]


def test_a_wrapper_installed_on_top_survives_and_ours_falls_through_once_detached():
    """A diffusers hook wraps ``forward`` after we set it: undoing leaves the hook, whose inner call (ours) then
    runs what was there before us."""
    state = {"active": True}
    ledger, module = Overrides(lambda: state["active"]), torch.nn.Identity()
    ledger.set(module, "forward", lambda x: x + 1)
    inner = module.forward
    vars(module)["forward"] = lambda x: inner(x) * 10
    assert module(1) == 20
    state["active"] = False
    ledger.undo_all()
    assert module(1) == 10 and "forward" in vars(module)  # the hook stays, ours falls through to stock
