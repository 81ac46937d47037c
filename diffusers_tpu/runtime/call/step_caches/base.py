"""What the step caches in whole-step programs share (the package's docstring): ``StepCache`` — the block lists,
stock's state per cache context, a batched call's rows, the trace hook — and, for hooks on submodules of every block
(TaylorSeer, Pyramid Attention Broadcast, FasterCache), ``LayerOutputs``: what each layer's hooked modules keep,
stacked over the layers, is the block loop's per-layer input and output. Blocks that cannot be one loop (Latte's
interleaved lists; a broken chain) are traced unrolled, the same part played per layer, their products stacked after."""

from __future__ import annotations

import contextlib
import functools

import jax
import jax.numpy as jnp
import torch

from ....interop.backend import to_jax_array, wrap
from ... import diffusers_private


class NotInProgram(Exception):
    """The cached step could not be traced as one program (the blocks do not form one chain): the unit route runs."""


def child_block_lists(module):
    return [(name, list(child)) for name, child in module.named_children() if isinstance(child, torch.nn.ModuleList)]


def rows_of(array, count: int, index: int):
    return array[index * (array.shape[0] // count) : (index + 1) * (array.shape[0] // count)]


class StepCache:
    """What the caches share: their block lists, stock's state objects per context, the program's extra inputs."""

    head_name = block_name = ""
    head_outside = False  # the head block's output decides: it runs outside the block loop
    pairs = True  # the guidance pair may share a call (each half keeps its own cache context's state)
    state_per_context = True  # False: kept by the call's inputs, so rows share a call whatever their contexts
    root_names: frozenset = frozenset()  # its hooks on the denoiser itself, whose part for a paired call it plays

    def __init__(self, lists: list, hooks: list):
        """``lists``: ``(path, blocks)`` of the block lists it plays a part in, in the order the forward calls them."""
        self.paths = tuple(path for path, _ in lists)
        self.path, self.head, self.tail = self.paths[0], hooks[0], hooks[-1]
        self.blocks = [b for _, bs in lists for b in bs]
        self.manager = getattr(self.head, "state_manager", None)  # Pyramid Attention Broadcast keeps none
        self.metadata = diffusers_private.block_metadata(self.head) if self.head_name else None
        # a block hook's view of each list's calls (which output is which), and each later list's inputs when traced
        firsts, count = {}, 0
        for path, blocks in lists:
            firsts[path], count = hooks[count], count + len(blocks)
        self.list_metadata = (
            {p: diffusers_private.block_metadata(h) for p, h in firsts.items()} if self.head_name else {}
        )
        self.list_inputs: dict = {}
        self.contexts: tuple = ()
        self.states: list = []
        self.key = None
        self.inputs: list = []  # the cache state fed to this call's program
        self.donated = 0  # how many of the last inputs the call replaces: their buffers are the program's to reuse
        self.traced = False
        self.spread = lambda tensor: tensor  # while tracing: the kept state's layout on the mesh (the denoiser's)
        self.returned: list = []  # while tracing: the state the program returns besides the forward's output
        self._saved: list = []

    @classmethod
    def accepts(cls, head) -> bool:
        return True

    def __repr__(self) -> str:
        return f"{type(self).__name__}({' + '.join(self.paths)}: {len(self.blocks)} blocks)"

    def current_context(self) -> str:
        name = diffusers_private.context_name(self.manager)
        if name is None:
            self.manager.get_state()  # stock's error: no cache context is set
        return name

    def plan(self, contexts: tuple) -> None:
        """Before a call: the states of ``contexts`` (the call's rows, in order), the program key, its inputs."""
        self.contexts = contexts
        self.states = [diffusers_private.cache_state(self.manager, name) for name in contexts]
        self._saved = [dict(vars(state)) for state in self.states]
        self._plan()

    def called_with(self, args, kwargs) -> None:
        """Before ``plan``: the call's arguments (a cache whose decision depends on their shapes reads them)."""

    def partner_called(self) -> None:
        """The loop's "uncond" call, answered from the batched pair this cache planned for both contexts."""

    def hand_back(self) -> None:
        """Before the unit route takes over the cache: stock's state objects as stock keeps them."""

    def undo_plan(self) -> None:
        """The call did not run: the states as they were before ``plan`` (host counters included)."""
        for state, saved in zip(self.states, self._saved):
            vars(state).clear()
            vars(state).update(saved)

    def argument(self, name: str, args, kwargs, metadata=None):
        return diffusers_private.block_argument(metadata or self.metadata, name, args, kwargs)

    def rows(self, array, index: int):
        return rows_of(array, len(self.contexts), index)

    def shapes(self) -> tuple:
        return tuple((tuple(a.shape), a.dtype) for a in self.inputs)

    def step(self, forward):
        """The method the program traces: the stock forward, returning the cache's new state beside its output."""

        def cached_step(*args, **kwargs):
            if not self.traced:  # traced without this file's hook, or run eagerly: the stock hooks would decide
                raise NotInProgram(f"{type(self).__name__} could not be traced in one program")
            self.returned = []
            out = forward(*args, **kwargs)
            self.forward_done()
            return out, [self.spread(wrap(a)) for a in self.returned]

        cached_step.__wrapped__ = forward
        return cached_step

    def trace_hook(self, scanning):
        """The cached step's trace hook (``jit.CompiledFunction``): the hooks set aside, the block lists traced as loops
        with this cache's part played (``scanning``: ``repeated_blocks.scanning``, called with ``cache=self``)."""
        return functools.partial(_traced_with_cache, self, scanning)

    def forward_done(self) -> None:
        """The stock forward was traced: what the program returns besides its output is known (``returned``)."""

    @contextlib.contextmanager
    def hooks_set_aside(self):
        """While the cached step is traced: the blocks without their diffusers hooks (this package plays their part)."""
        saved = [(b, {k: vars(b).pop(k) for k in ("forward", "_diffusers_hook") if k in vars(b)}) for b in self.blocks]
        self.traced = True
        try:
            yield
        finally:
            self.traced = False
            for block, attributes in saved:
                vars(block).update(attributes)

    # what ``repeated_blocks`` asks of a cache while the list is traced
    def skips_all(self) -> bool:
        return False

    def head_called(self, args, kwargs, out) -> None:
        pass

    def list_started(self, path: str, args, kwargs, out) -> None:
        """A list's block 0 ran: the head's decision (the first list), or the list's inputs (a later one)."""
        if path == self.path:
            return self.head_called(args, kwargs, out)
        meta = self.list_metadata.get(path)
        if meta is not None:
            hidden = to_jax_array(self.argument(meta.hidden_states_argument_name, args, kwargs, meta))
            text = meta.return_encoder_hidden_states_index is not None
            encoder = to_jax_array(self.argument("encoder_hidden_states", args, kwargs, meta)) if text else None
            self.list_inputs[path] = [hidden, encoder]

    def as_output(self, path: str, hidden, encoder):
        """A list's outputs (hidden and text states) in its blocks' output structure."""
        meta = self.list_metadata[path]
        if encoder is None or meta.return_encoder_hidden_states_index is None:
            return wrap(hidden)
        result = [None] * (max(meta.return_hidden_states_index, meta.return_encoder_hidden_states_index) + 1)
        result[meta.return_hidden_states_index] = wrap(hidden)
        result[meta.return_encoder_hidden_states_index] = wrap(encoder)
        return tuple(result)

    def as_arrays(self, path: str, out) -> list:
        """A list's outputs as [hidden, text or None] arrays."""
        meta = self.list_metadata[path]
        if not isinstance(out, tuple):
            return [to_jax_array(out), None]
        hidden = out[meta.return_hidden_states_index]
        index = meta.return_encoder_hidden_states_index
        return [to_jax_array(hidden), None if index is None else to_jax_array(out[index])]

    def layer_inputs(self, path: str, layers: range):
        """List ``path``'s loop's per-layer inputs, read and carried (``LayerOutputs``); None: nothing per layer."""
        return None, None


# -- caches on submodules of every block
def hooked_layers(module, hooks: dict, name: str):
    """``(groups, hooks, loose)`` when every module in ``hooks`` carries only the hook ``name`` and, in each block list
    of ``module`` they are in, sits at the same relative paths inside every block (``""``: the block itself); else None.
    ``groups``: ``(path, blocks, rels)`` per list, then a one-layer group per hooked module outside every list (its
    path in ``module``; TaylorSeer-lite's ``proj_out``), whose paths are ``loose``; ``hooks``: the stock hook objects,
    by group, relative path, then layer."""
    if not hooks or module in hooks or any(names != [name] for names in hooks.values()):
        return None
    groups, found, placed = [], [], set()
    for path, blocks in child_block_lists(module):
        where = {id(m): rel for b in blocks for rel, m in b.named_modules()}
        mine = [m for m in hooks if id(m) in where]
        if not mine:
            continue
        rels = sorted({where[id(m)] for m in mine})
        if len(blocks) < 2 or len(mine) != len(rels) * len(blocks):
            return None  # not the same modules hooked in every block
        groups.append((path, blocks, rels))
        found += [diffusers_private.hook_registry(b.get_submodule(rel)).hooks[name] for rel in rels for b in blocks]
        placed.update(id(m) for m in mine)
    if not groups:
        return None
    names, loose = {id(m): n for n, m in module.named_modules()}, []
    for hooked in (m for m in hooks if id(m) not in placed):
        groups.append((names[id(hooked)], [hooked], [""]))
        found.append(diffusers_private.hook_registry(hooked).hooks[name])
        loose.append(names[id(hooked)])
    return groups, found, frozenset(loose)


class LayerOutputs(StepCache):
    """A cache over hooked submodules of every block of one or more lists: each ``site`` (``"blocks.*.attn1"``: a
    list's path and a relative path; ``"blocks.*"``: the blocks themselves; ``"proj_out"``: a module outside the lists,
    one layer) keeps arrays keyed by tuples naming it, stacked over that list's layers; a list's block loop reads one
    layer's slice (``layer``) and returns what the layer produced."""

    carried: frozenset = frozenset()  # keys of the kept arrays this call replaces (``layer_inputs``)
    hook_name = ""

    @classmethod
    def recognize(cls, module, hooks: dict):
        """This cache over ``hooks`` when each site's layers agree on what its decision reads (``same``), else None."""
        found = hooked_layers(module, hooks, cls.hook_name)
        if found is None:
            return None
        cache = cls(*found)
        if any(len({cls.same(hook) for hook in cache.at(cache.found, site)}) > 1 for site in cache.sites):
            return None
        return cache

    @staticmethod
    def same(hook) -> tuple:
        """The settings of a hook that every layer of a site must share (one decision per site)."""
        return ()

    def __init__(self, groups: list, hooks: list, loose: frozenset = frozenset()):
        super().__init__([(path, blocks) for path, blocks, _ in groups if path not in loose], hooks)
        self.found, self.groups, self.loose = hooks, groups, loose
        self.sites, self.index = [], {}  # sites in order; (site, layer) -> its position in ``found``
        self.site_path, self.layers = {}, {}  # site -> its list's path, its number of layers
        self.modules, self.by_module = {}, {}  # (site, layer) -> the hooked module; its id -> (site, layer)
        for path, blocks, rels in groups:
            for rel in rels:
                site = path if path in loose else f"{path}.*.{rel}" if rel else f"{path}.*"
                self.sites.append(site)
                self.site_path[site], self.layers[site] = path, len(blocks)
                for layer, block in enumerate(blocks):
                    self.index[(site, layer)] = len(self.index)
                    self.modules[(site, layer)] = block.get_submodule(rel)
                    self.by_module[id(self.modules[(site, layer)])] = (site, layer)
        self.stacked: dict = {}  # while tracing: key -> the [layers, ...] array bound for this call
        self.current = None  # while a loop's body is traced: key -> that layer's array
        self.produced: dict = {}  # what the layer being traced produced: key -> array
        self.outside: dict = {}  # (path, layer) -> what it produced, for layers called outside the loop (block 0)
        self.loop = None  # (path, first layer, key -> [layers, ...]) the latest loop produced
        self.traced_meta: dict = {}  # per program key: what the trace found (``seen``), the new arrays' keys
        self.seen: dict = {}  # while tracing: per site, what its modules' outputs were (shapes, structure)
        self.produced_stacked: dict = {}  # while tracing: key -> the new [layers, ...] arrays, list by list
        self.held, self.written = None, set()  # while tracing: the carried arrays and layer; the ones written
        self.looped: set = set()  # while tracing: the lists whose layers ran as a loop

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(self.sites)})"

    def module_at(self, site: str, layer: int):
        return self.modules[(site, layer)]

    def at(self, entries: list, site: str) -> list:
        """``entries`` (one per stock hook, in ``found``'s order) of ``site``'s modules, by layer."""
        return [entries[self.index[(site, layer)]] for layer in range(self.layers[site])]

    def path_of(self, key: tuple) -> str:
        return next(self.site_path[part] for part in key if isinstance(part, str))

    @contextlib.contextmanager
    def hooks_set_aside(self):
        """The hooked modules run this package's part while traced (their stock hooks set aside)."""
        saved = []
        for module in self.modules.values():
            reference, attribute = diffusers_private.innermost_forward_reference(module)
            original = getattr(reference, attribute)
            saved.append(
                (module, {k: vars(module).pop(k) for k in ("forward", "_diffusers_hook") if k in vars(module)})
            )
            part = self._part(module, original)
            part._diffusers_tpu_same_in_every_block = True  # a block's signature accepts it (``block_signature``)
            vars(module)["forward"] = part
        self.traced, self.outside, self.loop, self.produced_stacked, self.seen = True, {}, None, {}, {}
        self.written, self.looped = set(), set()
        try:
            yield
        finally:
            self.traced = False
            for module, attributes in saved:
                vars(module).pop("forward", None)
                vars(module).update(attributes)

    def _part(self, module, original):
        site, layer = self.by_module[id(module)]
        path = self.site_path[site]

        def part(*args, **kwargs):
            if self.current is not None:  # a loop's body: the template block's module, the loop's layer
                return self.module_called(site, self.current, self.produced, original, args, kwargs)
            kept = {key: array[layer] for key, array in self.stacked.items() if self.path_of(key) == path}
            produced = self.outside.setdefault((path, layer), {})
            return self.module_called(site, kept, produced, original, args, kwargs)

        return part

    # what ``repeated_blocks`` asks of a cache with per-layer state
    def layer_inputs(self, path: str, layers: range) -> tuple[dict, dict]:
        """The list's loop inputs: the arrays read layer by layer (from ``layers.start``), and the ``carried`` ones,
        whole, which the loop carries and overwrites one layer's slice at a time (read, then written: the call's new
        arrays take the old ones' memory, where scanned outputs would be a second stack beside them)."""
        mine = {key: array for key, array in self.stacked.items() if self.path_of(key) == path}
        read = {key: array[layers.start :] for key, array in mine.items() if key not in self.carried}
        return read, {key: array for key, array in mine.items() if key in self.carried}

    @contextlib.contextmanager
    def layer(self, kept: dict, held: dict, index):
        now = {key: jax.lax.dynamic_index_in_dim(array, index, keepdims=False) for key, array in held.items()}
        self.current, self.produced, self.held = {**kept, **now}, {}, (held, index)
        try:
            yield
        finally:
            self.current = None

    def layer_outputs(self) -> tuple[dict, dict]:
        """What the layer produced: the carried arrays with its new slices written in, and the other new arrays."""
        (held, index), rest, new = self.held, dict(self.produced), {}
        for key, array in held.items():
            value = rest.get(key)
            if value is not None and (value.shape, value.dtype) == (array.shape[1:], array.dtype):
                new[key] = jax.lax.dynamic_update_index_in_dim(array, rest.pop(key), index, 0)
                self.written.add(key)
            else:  # not produced (or no longer of its shape): the old stack is not returned
                new[key] = array
        return new, rest

    def loop_outputs(self, path: str, layers: range, produced: dict, held: dict) -> None:
        self.loop = (path, layers.start, produced, held)

    def chain(self, run, path: str):
        """A list's last block: its loop ran; what its layers produced, stacked (block 0's too when outside)."""
        out = run()
        self.looped.add(path)
        _, start, produced, held = self.loop
        first = self.outside.get((path, 0), {})
        for key, array in produced.items():
            self.produced_stacked[key] = array if start == 0 else jnp.concatenate([first[key][None], array])
        for key, array in held.items():
            if key in self.written:
                self.produced_stacked[key] = array if start == 0 else array.at[0].set(first[key])
        return out

    def trace_hook(self, scanning):
        hook = super().trace_hook(scanning)
        hook.unrolled = functools.partial(_traced_unrolled, self)  # ``program.Retrace``'s plainer trace
        return hook

    def forward_done(self) -> None:
        """What every list's layers produced, stacked: from its loop, or (a list that ran unrolled) from each layer."""
        for path, blocks, _ in self.groups:
            if path in self.looped or not any(p == path for p, _ in self.outside):
                continue
            runs = [self.outside.get((path, layer)) for layer in range(len(blocks))]
            if any(run is None for run in runs) or any(run.keys() != runs[0].keys() for run in runs):
                raise NotInProgram(f"{path}'s hooked layers did not each run once")
            for key in runs[0]:
                self.produced_stacked[key] = jnp.stack([run[key] for run in runs])
        order = sorted(self.produced_stacked)
        self.returned = [self.produced_stacked[key] for key in order]
        self.traced_meta[self.key] = dict(self.seen), order

    def module_called(self, site: str, kept: dict, produced: dict, original, args, kwargs):
        raise NotImplementedError


@contextlib.contextmanager
def _traced_unrolled(cache, module, raw_state, prepare):
    """The cached step traced with its blocks unrolled (they could not be one loop): the hooked modules play the
    cache's part, each on its own layer's slice."""
    with cache.hooks_set_aside():
        yield None


@contextlib.contextmanager
def _traced_with_cache(cache, scanning, module, raw_state, prepare):
    with cache.hooks_set_aside(), scanning(module, raw_state, prepare, cache=cache) as finish:
        yield finish
