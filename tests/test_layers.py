"""The package's import graph: zero circles, and every import runs down the layers (docs/layout.md).

Every import counts, those inside functions too: a lazy import still ties the two modules together."""

import ast
import functools
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Bottom to top; a module may import its own layer (without a circle) and the layers below it.
LAYERS = ("kernels", "interop", "runtime", "families", "api", "planner", "testing", "demo", "commands")
ONLY_IMPORTED_BY = {"testing": {"testing", "commands"}}  # test models stay out of the product's import graph
SHIMS: dict = {}  # old module paths kept as one-line entries (none now: benchmarks live in benchmarks/)


def _modules() -> dict[str, str]:
    found = {}
    for folder, package in (("diffusers_tpu", "diffusers_tpu"), ("kernels", "diffusers_tpu.kernels")):
        for directory, _, files in os.walk(os.path.join(ROOT, folder)):
            for name in files:
                if not name.endswith(".py"):
                    continue
                relative = os.path.relpath(os.path.join(directory, name), os.path.join(ROOT, folder))[:-3]
                parts = [package] + [p for p in relative.split(os.sep) if p != "__init__"]
                found[".".join(parts)] = os.path.join(directory, name)
    return found


def _imported(module: str, path: str, modules) -> set[str]:
    package = module if path.endswith("__init__.py") else module.rsplit(".", 1)[0]
    targets = set()
    for node in ast.walk(ast.parse(open(path).read())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(base + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        else:
            continue
        for name in names:
            while name not in modules and "." in name:
                name = name.rsplit(".", 1)[0]
            if name in modules and name != module:
                targets.add(name)
    return targets


@functools.cache
def graph() -> dict[str, set[str]]:
    modules = _modules()
    return {module: _imported(module, path, modules) for module, path in modules.items()}


def layer_of(module: str) -> str:
    if module in SHIMS:
        return SHIMS[module]
    parts = module.split(".")
    if len(parts) == 1 or parts[1] not in LAYERS:
        return "api"
    return parts[1]


def _cycles(edges) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in edges[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def floors(edges) -> int:
    """The longest import chain, in modules (the graph's depth)."""

    @functools.cache
    def depth(node):
        return 1 + max((depth(n) for n in edges[node]), default=0)

    return max(depth(n) for n in edges)


def test_graph_sees_the_package():
    edges = graph()
    assert {
        "diffusers_tpu",
        "diffusers_tpu.interop.sharding",
        "diffusers_tpu.runtime.attach.pipeline_runtime",
        "diffusers_tpu.families.wan",
        "diffusers_tpu.kernels",
        "diffusers_tpu.commands.cli",
    } <= set(edges)
    assert (
        "diffusers_tpu.interop.backend" in edges["diffusers_tpu.runtime.attach.pipeline_runtime"]
    )  # relative imports resolved
    assert "diffusers_tpu.runtime.registry" in edges["diffusers_tpu.families.generic"]


def test_no_import_circles():
    assert _cycles(graph()) == []


def wrong_way(edges) -> list[str]:
    wrong = []
    for module, targets in sorted(edges.items()):
        here = layer_of(module)
        for target in sorted(targets):
            there = layer_of(target)
            allowed = ONLY_IMPORTED_BY.get(there)
            if LAYERS.index(there) > LAYERS.index(here) or (allowed is not None and here not in allowed):
                wrong.append(f"{module} ({here}) imports {target} ({there})")
    return wrong


def test_imports_run_down_the_layers():
    assert wrong_way(graph()) == []


def test_compat_at_the_bottom_patches_at_the_top():
    """interop/compat/ imports nothing of the package but its own modules, host_scalars (its policy for eager glue),
    patching (the one way to patch) and the private-name doors; host_scalars nothing but the doors; the doors and
    patching nothing; nothing but the package's __init__ imports runtime/patches/entry_points; and bench / cli share
    their helpers instead of importing each other."""
    edges, p = graph(), "diffusers_tpu."
    doors = {p + "interop.jax_private", p + "interop.torch_private", p + "interop.torchax_private"}
    compat = {m for m in edges if m.startswith(p + "interop.compat.")}
    assert {p + "interop.compat.torchax_tensors", p + "interop.compat.torch_itself"} <= compat
    assert all(edges[m] <= {p + "interop.host_scalars", p + "interop.patching"} | doors | compat for m in compat)
    assert edges[p + "interop.compat.torch_itself"] == {p + "interop.patching", p + "interop.torch_private"}
    assert edges[p + "interop.host_scalars"] == doors and edges[p + "interop.patching"] == set()
    assert all(edges[door] == set() for door in doors | {p + "interop.versions", p + "runtime.diffusers_private"})
    assert {m for m, targets in edges.items() if p + "runtime.patches.entry_points" in targets} == {"diffusers_tpu"}
    assert p + "commands.cli" not in edges[p + "commands.bench"]


PATCH_ROOMS = ("diffusers_tpu.interop.compat.", "diffusers_tpu.runtime.patches.")


def patchers() -> set[str]:
    """The modules that patch a third-party attribute for good (``patching.wrap`` / ``replace``)."""
    found = set()
    for module, path in _modules().items():
        for node in ast.walk(ast.parse(open(path).read())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("wrap", "replace")
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "patching"
            ):
                found.add(module)
    return found


def test_every_patch_lives_in_a_patch_room():
    """torch's and torchax's patches in interop/compat/, diffusers' and peft's in runtime/patches/; elsewhere a
    stand-in only for the length of a ``with patching.temporarily(...)`` (the planner's)."""
    found = patchers()
    assert (
        "diffusers_tpu.runtime.patches.entry_points" in found and "diffusers_tpu.interop.compat.torch_itself" in found
    )
    assert sorted(m for m in found if not m.startswith(PATCH_ROOMS)) == []


def rooms_of(edges, package: str) -> dict[str, set[str]]:
    """The import graph between ``package``'s rooms: each sub-folder and each module directly in it is one room."""
    prefix = package + "."

    def room(module):
        return module[len(prefix) :].split(".")[0] if module.startswith(prefix) else None

    rooms: dict[str, set[str]] = {}
    for module, targets in edges.items():
        here = room(module)
        if here is None:
            continue
        rooms.setdefault(here, set())
        rooms[here] |= {there for t in targets if (there := room(t)) not in (None, here)}
    return rooms


def _packages_with_rooms() -> list[str]:
    """Every folder below the layers (the layers themselves: ``test_imports_run_down_the_layers``)."""
    return sorted(m for m, path in _modules().items() if path.endswith("__init__.py") and m.count(".") >= 1)


@pytest.mark.parametrize("package", _packages_with_rooms())
def test_no_two_rooms_of_a_folder_import_each_other(package):
    """Inside a layer the sub-folders are layered too (``runtime/attach``, ``call``, ``weights``...): no two import
    each other, directly or round a longer circle."""
    assert _cycles(rooms_of(graph(), package)) == []


# runtime's rooms, bottom to top (docs/layout.md): a room imports rooms of lower floors only, not one beside or above.
RUNTIME_FLOORS = (
    ("diffusers_private", "registry", "text_encoder_placement", "to_arguments", "programs", "attention"),
    ("support", "weights"),
    ("call", "config"),
    ("decision",),
    ("attach",),
    ("gpu_script", "files"),
    ("patches",),
)


def arrows_up(rooms: dict[str, set[str]], floors) -> list[str]:
    floor = {room: n for n, names in enumerate(floors) for room in names}
    unplaced = sorted(set(rooms) - set(floor))
    return [f"{r} has no floor" for r in unplaced] + [
        f"{here} (floor {floor[here]}) imports {there} (floor {floor[there]})"
        for here, targets in sorted(rooms.items())
        if here in floor
        for there in sorted(targets)
        if there in floor and floor[there] >= floor[here]
    ]


def test_runtime_rooms_import_only_downwards():
    assert arrows_up(rooms_of(graph(), "diffusers_tpu.runtime"), RUNTIME_FLOORS) == []


def test_an_arrow_up_is_caught():
    assert arrows_up({"call": {"attach"}, "attach": {"call"}}, RUNTIME_FLOORS) == [
        "call (floor 2) imports attach (floor 4)"
    ]
    assert arrows_up({"new_room": set()}, RUNTIME_FLOORS) == ["new_room has no floor"]


def test_room_knots_are_caught():
    p = "diffusers_tpu.runtime."
    edges = {p + "call.denoiser": {p + "weights.lora"}, p + "weights.lora": {p + "call.block"}, p + "call.block": set()}
    assert _cycles(rooms_of(edges, "diffusers_tpu.runtime")) == [["call", "weights"]]


def test_floors_stay_few():
    assert floors(graph()) <= 14  # the longest import chain today (docs/layout.md)


@pytest.mark.parametrize(
    "edges, circle", [({"a": {"b"}, "b": {"c"}, "c": {"a"}}, ["a", "b", "c"]), ({"a": {"b"}, "b": set()}, None)]
)
def test_the_checks_catch_what_they_look_for(edges, circle):
    assert _cycles(edges) == ([circle] if circle else [])
    assert layer_of("diffusers_tpu.interop.sharding") == "interop" and layer_of("diffusers_tpu") == "api"
    assert floors({"a": {"b"}, "b": {"c"}, "c": set()}) == 3


def test_wrong_way_imports_are_caught():
    p = "diffusers_tpu."
    edges = {
        p + "interop.sharding": {p + "runtime.weights.lora"},
        p + "runtime.weights.lora": {p + "interop.sharding"},
        p + "demo.build": {p + "testing.tiny"},
        p + "commands.cli": {p + "testing.tiny"},
        p + "testing.tiny": set(),
    }
    assert wrong_way(edges) == [
        f"{p}demo.build (demo) imports {p}testing.tiny (testing)",
        f"{p}interop.sharding (interop) imports {p}runtime.weights.lora (runtime)",
    ]


ROOM_LINES = 400  # files stay small: a module that grows past it splits by what its parts do


def long_rooms(modules: dict[str, str]) -> list[str]:
    return [
        f"{module}: {source.count(chr(10))} lines"
        for module, path in sorted(modules.items())
        if (source := open(path).read()).count("\n") > ROOM_LINES
    ]


def test_no_module_over_400_lines(tmp_path):
    assert long_rooms(_modules()) == []
    long = tmp_path / "long.py"
    long.write_text('"""A module. Over 400 lines on purpose."""\n' + "x = 1\n" * ROOM_LINES)
    assert long_rooms({"long": str(long)}) == [f"long: {ROOM_LINES + 1} lines"]  # no phrase exempts it
