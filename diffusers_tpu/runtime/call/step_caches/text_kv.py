"""TextKVCache (``TextKVCacheConfig``; NucleusMoE-Image) in the denoiser's programs: each block's text keys and values
computed once per prompt — by stock's own block hook, traced — kept on the devices stacked over the layers, and read
by every later step's program through the block loop. Two programs: computing, reusing.

Stock keys what it keeps by the text states a call gets (their ``data_ptr()``), not by cache context, so any rows may
share a call (``state_per_context = False``): the guidance pair is one batch over ``dp`` whether or not the loop
names its contexts (NucleusMoE-Image's does not), its text states one array from step to step (``cfg``), the key of
both rows. Lossless as stock's: the same image as without the cache."""

from __future__ import annotations

import contextlib

import torch

from ....interop.backend import is_jax_tensor, to_jax_array, wrap
from ... import diffusers_private
from .base import LayerOutputs, NotInProgram

_KEPT = "diffusers_tpu"  # this cache's entries among stock's keys (``data_ptr`` integers) in a block state's kv_cache


class TextKV(LayerOutputs):
    """TextKVCache on the blocks of one or more lists (each block hooked itself: site ``"<list>.*"``)."""

    hook_name = "text_kv_cache_block"
    root_names = frozenset({"text_kv_cache_transformer"})
    state_per_context = False

    def __init__(self, groups, hooks, loose=frozenset()):
        super().__init__(groups, hooks, loose)
        self.compute, self.text, self.calling, self.order = True, None, None, ()
        self.computing_calls = 0  # calls that computed the text keys and values (the others read the kept ones)

    def current_context(self):
        return None  # kept by the call's text states, whatever the context

    def called_with(self, args, kwargs) -> None:
        text = kwargs.get("encoder_hidden_states")
        if not isinstance(text, torch.Tensor):
            raise NotInProgram("TextKVCache: the call's text states are not an ``encoder_hidden_states`` keyword")
        # a JAX tensor's array (immutable: an in-place op gives the tensor another); a host tensor and its version
        self.text = (to_jax_array(text),) if is_jax_tensor(text) else (text, text._version)

    def _store(self) -> dict:
        """Where the kept arrays live: the first block's stock state, cleared by stock's reset (each pipeline call)."""
        return diffusers_private.cache_state(self.found[0].block_state_manager, "inference").kv_cache

    def plan(self, contexts: tuple) -> None:
        self.contexts, self.states, self._saved = contexts, [], []
        entry = self._store().get((_KEPT, id(self.text[0])))
        if entry is not None and entry[0][1:] != self.text[1:]:  # (the entry holds the object: its id is its own)
            entry = None  # a host tensor edited in place since
        self.compute = entry is None
        self.order, self.inputs = ((), []) if entry is None else (entry[1], list(entry[2]))
        self.key = ("text_kv", self.compute, tuple(self.order), self.shapes())

    def hand_back(self) -> None:
        """Before the unit route takes over: stock's hooks compute their own (the kept arrays let go)."""
        store = self._store()
        for key in [k for k in store if isinstance(k, tuple) and k[0] == _KEPT]:
            del store[key]

    @contextlib.contextmanager
    def bound(self, arrays):
        self.stacked = dict(zip(self.order, arrays))
        yield

    def _part(self, module, original):
        part, hook = super()._part(module, original), self.found[self.index[self.by_module[id(module)]]]

        def called(*args, **kwargs):
            self.calling = hook, module
            return part(*args, **kwargs)

        return called

    def module_called(self, site, kept, produced, original, args, kwargs):
        """The block through its stock hook: the text keys and values it computes (this layer's), or the kept ones."""
        hook, module = self.calling
        given = None if self.compute else (wrap(kept[(site, 0)]), wrap(kept[(site, 1)]))
        # stock's hook writes the keys and values into the block's attention keywords: a copy, the caller's untouched
        attention = dict(kwargs.get("attention_kwargs") or {})
        out, (keys, values) = diffusers_private.text_kv_block_call(
            hook, module, given, args, dict(kwargs, attention_kwargs=attention)
        )
        if self.compute:
            produced[(site, 0)], produced[(site, 1)] = to_jax_array(keys), to_jax_array(values)
        return out

    def commit(self, arrays) -> list:
        """After the call: a computing call's arrays kept for its text states; every block ran, in every row."""
        if self.compute:
            self.computing_calls += 1
            _, order = self.traced_meta[self.key]
            kept = [to_jax_array(a) for a in arrays]
            self._store()[(_KEPT, id(self.text[0]))] = (self.text, tuple(order), kept)
        return [(True, len(self.blocks), len(self.blocks))] * len(self.contexts)
