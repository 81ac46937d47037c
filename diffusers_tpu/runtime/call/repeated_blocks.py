"""A denoiser's repeated blocks compiled once: the stock block loop traced as one ``lax.scan``.

A video transformer is a stack of identical blocks (Wan 30-40, CogVideoX 42, HunyuanVideo 54) that stock code
calls in a Python loop (``for block in self.blocks: h = block(h, ...)``). Traced as it is, the program holds one copy
of the block per layer and XLA compiles every copy: compile time grows with depth. Here the loop stays stock code;
what changes is what the calls do while the whole forward is traced (``jit.CompiledFunction(trace_hook=...)``):

- block 0 runs as usual (it tells each output's shape);
- blocks 1 .. N-2 return placeholders instead of computing, after checking that the call is a chain: every tensor
  argument is either the previous block's output (carried) or the same value as block 1's (constant), every other
  argument equal;
- block N-1 runs the chain as one ``lax.scan``: the body is the stock block forward traced once. Block 0 is the
  loop's first iteration when its own call fits the chain (its carried inputs start the loop; its traced call is
  left unused and dropped by XLA), so the program holds one copy of the block; else the loop is blocks 1 .. N-1.
  Weights the runtime stores stacked (``runtime.stacked_weights``: one ``[N, ...]`` array per weight of the list,
  a program argument) are indexed by the loop counter, as a scan over stacked parameters does; any other weight
  (an adapter added after placing, a quantized weight) and the LoRA scales are picked per layer by a
  ``lax.switch`` over the layers' own arrays (a copy of that layer's values per iteration).

Anything else keeps the exact stock meaning. Blocks that differ in any way (class, weights' shapes, attributes,
hooks, a monkeypatched forward) are not scanned. A call that breaks the chain (a residual added between blocks, a
skipped block) makes the pending blocks run one by one, exactly as unrolled. A placeholder read by anything but
the next block, a block that edits its inputs in place, or any error while a scan was traced: the whole forward is
traced again unrolled (``program.Retrace``). ``TPUConfig(scan_blocks=False)`` turns it off. Which blocks are
interchangeable (a block's ``signature``) is ``block_signature``; a step cache's part, ``step_caches``.
"""

from __future__ import annotations

import contextlib
import functools
import logging

import jax
import jax.numpy as jnp
import torch

from ...interop import torch_private, torchax_private
from ...interop.backend import to_jax_array, wrap
from ...interop.program import Retrace
from ...interop.torch_private import pytree
from ...interop.weights import LayerOf, gathered, materialized
from ..weights.block_signature import MIN_SCANNED, block_lists, traced_dict

logger = logging.getLogger(__name__)


class _DeferredOutput:
    """The array behind a deferred block's output: it has a shape and dtype, and any other use breaks the chain."""

    __slots__ = ("shape", "dtype", "session")

    def __init__(self, shape, dtype, session):
        self.shape, self.dtype, self.session = tuple(shape), dtype, session

    @property
    def ndim(self):
        return len(self.shape)

    def _broken(self):
        self.session.broken = "a deferred block output was used outside the block chain"
        raise Retrace(self.session.broken)

    def __getattr__(self, name):
        self._broken()

    def __jax_array__(self):
        self._broken()

    def __array__(self, *args, **kwargs):
        self._broken()


def _is_placeholder(value) -> bool:
    return isinstance(value, torch.Tensor) and isinstance(getattr(value, "_elem", None), _DeferredOutput)


def _array(value):
    return torchax_private.array(value) if torchax_private.holds_array(value) else to_jax_array(value)


def _mark(value):
    """What identifies a tensor argument's value: a torchax tensor's array, a host tensor's object and version."""
    return torchax_private.array(value) if torchax_private.holds_array(value) else (id(value), value._version)


def _same(a, b) -> bool:
    return a is b if not isinstance(a, tuple) else a == b


class _Session:
    def __init__(self, raw_state: dict, prepare):
        self.raw_state, self.prepare = raw_state, prepare
        self.broken: str | None = None
        self.in_body = False
        self.scans = 0


class _Call:
    """One block call: its argument structure, tensor leaves' arrays (as they were at the call), placeholders."""

    def __init__(self, index, args, kwargs):
        self.index = index
        leaves, self.spec = pytree.tree_flatten((args, kwargs))
        self.leaves = leaves
        self.arrays = [_array(x) if isinstance(x, torch.Tensor) else None for x in leaves]
        self.marks = [_mark(x) if isinstance(x, torch.Tensor) else None for x in leaves]
        self.outputs: list = []  # placeholders (deferred) or real tensors, flattened

    def avals(self):
        return [None if a is None else (tuple(a.shape), a.dtype) for a in self.arrays]


class _BlockListCalls:
    """The calls of one block list during one trace (``cache``: the step cache playing its hooks' part, if any)."""

    def __init__(self, session: _Session, path: str, blocks: list, forwards: list, cache=None):
        self.session, self.path, self.blocks, self.forwards, self.cache = session, path, blocks, forwards, cache
        self.reset()

    def reset(self):
        self.next, self.deferring, self.first, self.start, self.pending, self.roles = 0, True, None, None, [], None

    def call(self, index: int, args, kwargs):
        forward = self.forwards[index]
        if self.session.in_body:
            return forward(*args, **kwargs)
        if self.cache is not None and self.cache.skips_all():
            return self.cache.passthrough(self.path, index, args, kwargs)
        if index == 0:
            self.reset()
        if not self.deferring or index != self.next:
            return self._give_up(forward, args, kwargs)
        self.next += 1
        call = _Call(index, args, kwargs)
        if index == 0:
            out = forward(*args, **kwargs)
            if any(m is not None and not _same(_mark(leaf), m) for leaf, m in zip(call.leaves, call.marks)):
                self.deferring = False  # the block edits its inputs in place: calls stay as they are
            call.outputs, self.out_spec = pytree.tree_flatten(out)
            self.first = call
            if self.cache is not None:
                self.cache.list_started(self.path, args, kwargs, out)
            return out
        if not self._chained(call):
            return self._give_up(forward, args, kwargs)
        last = index == len(self.blocks) - 1
        if last and (len(self.pending) + 1 >= MIN_SCANNED or self.cache is not None):
            self.pending.append(call)
            result = self._scan() if self.cache is None else self.cache.chain(self._scan, self.path)
            self.reset()
            return result
        if last:
            return self._give_up(forward, args, kwargs)
        call.outputs = [
            wrap(_DeferredOutput(x.shape, _array(x).dtype, self.session)) if isinstance(x, torch.Tensor) else x
            for x in self.first.outputs
        ]
        self.pending.append(call)
        return pytree.tree_unflatten(call.outputs, self.out_spec)

    def _chained(self, call: _Call) -> bool:
        """Is ``call`` the next link: tensors carried from the previous block or the same as block 1's?"""
        if call.index == 1:  # fixes the roles: which argument carries which output of the previous block
            if call.spec != self.first.spec or call.avals() != self.first.avals():
                return False
            outputs = {id(x): q for q, x in enumerate(self.first.outputs) if isinstance(x, torch.Tensor)}
            self.roles = [
                ("carry", outputs[id(x)])
                if isinstance(x, torch.Tensor) and id(x) in outputs
                else ("const", (a, m))
                if a is not None
                else ("static", x)
                for x, a, m in zip(call.leaves, call.arrays, call.marks)
            ]
            self.start = call
            return any(role == "carry" for role, _ in self.roles)
        previous = self.pending[-1].outputs if self.pending else None
        if call.spec != self.start.spec or previous is None:
            return False
        for leaf, mark, (role, value) in zip(call.leaves, call.marks, self.roles):
            if role == "carry" and leaf is not previous[value]:
                return False
            if role == "const" and not _same(mark, value[1]):
                return False
            if role == "static" and not (type(leaf) is type(value) and leaf == value):
                return False
        return True

    def _first_in_chain(self) -> bool:
        """Does block 0's call fit the chain block 1 fixed (constants the same values, statics equal)? Never when a
        step cache reads block 0's output (FirstBlockCache): it runs outside the loop, once."""
        if self.cache is not None and self.cache.head_outside and self.path == self.cache.path:
            return False
        for position, (role, value) in enumerate(self.roles):
            if role == "const" and not _same(self.first.marks[position], value[1]):
                return False
            leaf = self.first.leaves[position]
            if role == "static" and not (type(leaf) is type(value) and leaf == value):
                return False
        return True

    def _give_up(self, forward, args, kwargs):
        """Run the deferred calls one by one (exactly the unrolled loop), then this call; no deferring after."""
        if self.cache is not None:
            raise Retrace(f"{self.path}: the cached blocks are not called as one chain")
        self.deferring = False
        for call in self.pending:
            real = [
                wrap(a) if a is not None and not _is_placeholder(x) else x for x, a in zip(call.leaves, call.arrays)
            ]
            out_args, out_kwargs = pytree.tree_unflatten(real, call.spec)
            before = [torchax_private.array(x) if isinstance(x, torch.Tensor) else None for x in real]
            out = pytree.tree_leaves(self.forwards[call.index](*out_args, **out_kwargs))
            if any(isinstance(x, torch.Tensor) and torchax_private.array(x) is not b for x, b in zip(real, before)):
                raise Retrace(f"{self.path}.{call.index} edits its inputs in place")
            for placeholder, value in zip(call.outputs, out):
                if isinstance(placeholder, torch.Tensor):
                    torchax_private.set_array(placeholder, torchax_private.array(value))
        self.pending = []
        return forward(*args, **kwargs)

    def _scan(self):
        """The chain as one loop over its weights (blocks 0 or 1 .. N-1; the call of block N-1 returns real outputs)."""
        session, template = self.session, self.blocks[1]
        names = [n for n, _ in template.named_parameters(remove_duplicate=False)]
        names += [n for n, _ in template.named_buffers(remove_duplicate=False)]
        dicts = [(p, k) for p, m in template.named_modules() for k, v in sorted(vars(m).items()) if traced_dict(v)]
        # block 0 joins the loop when its call is the chain's first link (its carried inputs start the loop): one copy
        layers = range(0 if self._first_in_chain() else 1, len(self.blocks))

        def stored(index: int, name: str):
            """Layer ``index``'s raw weight ``name``: an array, or a ``LayerOf`` a stacked argument."""
            block = self.blocks[index]
            found = session.raw_state.get(f"{self.path}.{index}.{name}")
            if found is None:
                tensors = dict(block.named_parameters(remove_duplicate=False))
                tensors.update(block.named_buffers(remove_duplicate=False))
                found = _array(tensors[name])
            return found

        # weights stacked in block order (``runtime.stacked_weights``) indexed by the loop; others switched per layer
        stacked, picked = {}, []
        for name in names:
            found = [stored(i, name) for i in layers]
            if all(
                isinstance(f, LayerOf) and f.array is found[0].array and f.index == i for f, i in zip(found, layers)
            ):
                stacked[name] = (found[0].array, found[0].sharding)
            else:
                picked.append(name)

        def raw(index: int):
            block = self.blocks[index]
            weights = [materialized(stored(index, n)) for n in picked]
            scales = [_array(v) for p, k in dicts for v in getattr(block.get_submodule(p), k).values()]
            return weights, scales

        per_layer = [raw(i) for i in layers]
        shapes = {
            str(jax.tree_util.tree_structure(v)) + str([(a.shape, a.dtype) for a in jax.tree_util.tree_leaves(v)])
            for v in per_layer
        }
        if len(shapes) != 1:
            raise Retrace(f"{self.path}: layers store their weights differently")
        branches = [lambda v=v: v for v in per_layer]
        switched = bool(jax.tree_util.tree_leaves(per_layer[0]))
        start, roles, first = self.start, self.roles, self.first
        out_static = [None if isinstance(x, torch.Tensor) else x for x in first.outputs]
        carry_avals = [(tuple(x.shape), _array(x).dtype) for x in first.outputs if isinstance(x, torch.Tensor)]
        tensor_slot = [q for q, x in enumerate(first.outputs) if isinstance(x, torch.Tensor)]
        forward = self.forwards[1]
        # a step cache's per-layer arrays: read layer by layer, and carried whole (written over one layer at a time)
        kept, held = self.cache.layer_inputs(self.path, layers) if self.cache is not None else (None, None)
        in_layer = self.cache.layer if kept is not None else lambda *_: contextlib.nullcontext()

        def body(carry, xs):
            (carry, held_now), (step, kept_now) = carry, xs
            weights, scales = jax.lax.switch(step, branches) if switched else ([], [])
            tensors = {n: wrap(session.prepare(w)) for n, w in zip(picked, weights)}
            tensors.update(
                {
                    n: wrap(
                        session.prepare(
                            gathered(jax.lax.dynamic_index_in_dim(array, step + layers.start, keepdims=False), used_as)
                        )
                    )
                    for n, (array, used_as) in stacked.items()
                }
            )
            by_output = dict(zip(tensor_slot, carry))
            leaves = [
                wrap(by_output[v]) if role == "carry" else wrap(v[0]) if role == "const" else v for role, v in roles
            ]
            inputs = [x for x in leaves if isinstance(x, torch.Tensor)]
            before = [torchax_private.array(x) for x in inputs]
            args, kwargs = pytree.tree_unflatten(leaves, start.spec)
            layer = in_layer(kept_now, held_now, step + layers.start)
            with _picked(template, dicts, scales), torch_private.reparametrized(template, tensors), layer:
                session.in_body = True
                try:
                    out = forward(*args, **kwargs)
                finally:
                    session.in_body = False
            if any(torchax_private.array(x) is not b for x, b in zip(inputs, before)):
                raise Retrace(f"{self.path}.1 edits its inputs in place")
            leaves, spec = pytree.tree_flatten(out)
            if spec != self.out_spec or [None if isinstance(x, torch.Tensor) else x for x in leaves] != out_static:
                raise Retrace(f"{self.path}: a block's outputs differ in structure from block 0's")
            arrays = [_array(x) for x in leaves if isinstance(x, torch.Tensor)]
            if [(tuple(a.shape), a.dtype) for a in arrays] != carry_avals:
                raise Retrace(f"{self.path}: a block's outputs differ in shape from block 0's")
            held_now, new = self.cache.layer_outputs() if kept is not None else (None, None)
            return (arrays, held_now), new

        if layers.start == 0:  # the carried inputs of block 0; an output no block reads starts as zeros
            fed = {value: first.arrays[p] for p, (role, value) in enumerate(roles) if role == "carry"}
            init = [fed[q] if q in fed else jnp.zeros(*aval) for q, aval in zip(tensor_slot, carry_avals)]
        else:
            init = [_array(x) for x in first.outputs if isinstance(x, torch.Tensor)]
        (final, held), produced = jax.lax.scan(body, (init, held), (jnp.arange(len(per_layer)), kept))
        if kept is not None:
            self.cache.loop_outputs(self.path, layers, produced, held)
        session.scans += 1
        results = iter(final)
        return pytree.tree_unflatten([wrap(next(results)) if s is None else s for s in out_static], self.out_spec)


@contextlib.contextmanager
def _picked(template, dicts: list, values: list):
    """The template's traced dicts (LoRA scales) hold the picked layer's values."""
    saved, values = [], iter(values)
    for path, key in dicts:
        owner = template.get_submodule(path)
        saved.append((owner, key, getattr(owner, key)))
        setattr(owner, key, {name: wrap(next(values)) for name in getattr(owner, key)})
    try:
        yield
    finally:
        for owner, key, original in saved:
            setattr(owner, key, original)


_DEFERRING: dict[type, type] = {}


def _deferring(cls: type) -> type:
    """``cls`` with a ``__call__`` that hands the call to its chain (hooks and forward then run, or are deferred)."""
    if cls not in _DEFERRING:

        def __call__(self, *args, **kwargs):
            chain, index = vars(self)["_diffusers_tpu_chain"]
            return chain.call(index, args, kwargs)

        _DEFERRING[cls] = type(
            cls.__name__, (cls,), {"__call__": __call__, "__module__": cls.__module__, "__qualname__": cls.__qualname__}
        )
    return _DEFERRING[cls]


@contextlib.contextmanager
def scanning(module: torch.nn.Module, raw_state: dict, prepare, cache=None):
    """``jit.CompiledFunction``'s ``trace_hook``: the block lists run as the module docstring says while ``module``'s
    forward is traced (``cache``: a step cache playing its part on its list); yields ``finish(out)`` to check it."""
    session = _Session(raw_state, prepare)
    installed = []
    lists = block_lists(module, always=cache.paths if cache is not None else ())
    if cache is not None and not set(cache.paths) <= set(dict(lists)):
        raise Retrace(f"{cache}: the cached blocks are not interchangeable")
    for path, blocks in lists:
        # a block's real call: its hooks (activation constraints) and forward, as ``Module.__call__`` runs them
        calls = [functools.partial(torch.nn.Module.__call__, block) for block in blocks]
        mine = cache if cache is not None and path in cache.paths else None
        chain = _BlockListCalls(session, path, blocks, calls, mine)
        for index, block in enumerate(blocks):
            installed.append((block, type(block)))
            vars(block)["_diffusers_tpu_chain"] = (chain, index)
            block.__class__ = _deferring(type(block))

    def finish(out):
        if any(_is_placeholder(x) for x in pytree.tree_leaves(out)):
            session.broken = "a deferred block output is returned"
        if session.broken:
            raise Retrace(session.broken)

    try:
        yield finish
    except Retrace:
        raise
    except Exception as error:
        if session.scans or session.broken:  # traced again unrolled: a real error shows up there unchanged
            raise Retrace(f"{type(error).__name__} while tracing a scanned forward: {error}") from error
        raise
    finally:
        for block, cls in installed:
            block.__class__ = cls
            vars(block).pop("_diffusers_tpu_chain", None)
    if session.scans:
        logger.debug("traced %d block loop(s) of %s as scans", session.scans, type(module).__name__)
