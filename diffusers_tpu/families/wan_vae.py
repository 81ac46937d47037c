"""Wan VAE (``AutoencoderKLWan``, 2.1 and 2.2) decode and encode in fixed-size temporal chunks.

The stock ``_decode`` loops over latent frames in Python, carrying a feature cache (the last two input frames of
every causal conv). Its entries are ``None``, the marker ``"Rep"`` (no temporal upsampling yet) or 1-frame tensors
while the first two latent frames go through; from then on every entry is a 2-frame tensor. So:

- program A decodes latent frame 0 exactly as stock does (``first_chunk``), and hands on its cache in the form every
  later frame's takes: a 1-frame entry with a zero frame before it, a ``"Rep"`` marker as two zero frames. That is
  what the causal convolutions compute with on frame 1 anyway (they pad missing past frames with zeros; a ``"Rep"``
  upsampler runs its time conv on zero padding), so frame 1 decodes with stock's numbers in program B;
- program B decodes ``vae_decode_chunk`` frames given the uniform cache, with ``lax.scan`` over the frames (the
  cache is the carry), calling the stock decoder once per frame as stock does;
- the remaining frames are zero-padded to a chunk multiple and the extra output trimmed (the decoder is causal:
  trailing padding cannot change earlier frames).

Two programs serve every frame count at a resolution (the decoder traced twice, not three times: compile time is
the TPU compiler's minutes per 3-D convolution), results are the stock decode's, and the program memory
does not depend on the frame count (one frame's activations at a time). Encoding mirrors it: the encoder's first
two calls (frame 0, then frames 1-4) in program A, then chunks of ``vae_encode_chunk`` latent frames (4 input
frames each) in program B.
"""

from __future__ import annotations

import contextlib
import functools
import math

import jax
import jax.numpy as jnp
import torch
from diffusers.models.autoencoders.autoencoder_kl_wan import CACHE_T, WanResample, patchify, unpatchify
from diffusers.models.autoencoders.vae import DecoderOutput

from ..interop import backend
from ..interop.jit import CompiledFunction


def _scan(step, cache: list, frames, per_call: int):
    """``step(cache, x) -> (cache, out)`` over ``frames`` ``[B, C, K * per_call, H, W]`` in calls of ``per_call``
    frames, with ``lax.scan``; returns the cache and the outputs concatenated along time."""
    array = backend.to_jax_array(frames)
    batch, channels, total, height, width = array.shape
    calls = array.reshape(batch, channels, total // per_call, per_call, height, width)
    calls = jnp.moveaxis(calls, 2, 0)  # [K, B, C, per_call, H, W]

    # Cache slots of convs that never cache stay None: they ride along as constants, the rest is the carry.
    live = [i for i, entry in enumerate(cache) if isinstance(entry, torch.Tensor)]

    def full(carry):
        entries = list(cache)
        for i, array in zip(live, carry):
            entries[i] = backend.wrap(array)
        return entries

    def body(carry, x):
        with backend.jax_mode():
            new_cache, out = step(full(carry), backend.wrap(x))
        return [backend.to_jax_array(new_cache[i]) for i in live], backend.to_jax_array(out)

    carry, outs = jax.lax.scan(body, [backend.to_jax_array(cache[i]) for i in live], calls)
    outs = jnp.moveaxis(outs, 0, 2)  # [B, C', K, f, H', W']
    b, c, k, f, h, w = outs.shape
    return full(carry), backend.wrap(outs.reshape(b, c, k * f, h, w))


def _decode_first(vae, z, cache=None, start: int = 0):
    """Stock ``_decode``'s loop over latent frames ``start, start + 1, ...`` (``cache``: the feature cache after
    frame ``start - 1``; a fresh one for ``start=0``)."""
    x = vae.post_quant_conv(z)
    cache = [None] * vae._cached_conv_counts["decoder"] if cache is None else list(cache)
    outs = [
        vae.decoder(x[:, :, i : i + 1], feat_cache=cache, feat_idx=[0], first_chunk=start + i == 0)
        for i in range(z.shape[2])
    ]
    return torch.cat(outs, 2), cache


FIRST_FRAMES = 1  # latent frames program A decodes; every later one runs in the chunk program
PROGRAMS = ("decode_first", "decode_chunk", "encode_first", "encode_chunk")  # what ``install`` compiles


@contextlib.contextmanager
def _first_frame_repeats(decoder, repeats: dict):
    """While frame 0 is decoded: each temporal upsampler that marks its cache slot ``"Rep"`` (skipping its time conv
    on the first frame) records the shape and dtype of its input in ``repeats[slot]``."""
    upsamplers = [m for m in decoder.modules() if isinstance(m, WanResample) and m.mode == "upsample3d"]

    def recording(module, x, feat_cache=None, feat_idx=(0,)):
        if feat_cache is not None and feat_cache[feat_idx[0]] is None:
            repeats[feat_idx[0]] = (tuple(x.shape), x.dtype)
        return type(module).forward(module, x, feat_cache=feat_cache, feat_idx=feat_idx)

    for module in upsamplers:
        module.forward = functools.partial(recording, module)
    try:
        yield
    finally:
        for module in upsamplers:
            del module.forward


def _steady(cache: list, repeats: dict) -> list:
    """The cache after frame 0 in the form every later frame's takes (module docstring): same numbers."""
    steady, like = [], next(entry for entry in cache if isinstance(entry, torch.Tensor))
    for slot, entry in enumerate(cache):
        if isinstance(entry, str):  # "Rep": on frame 1 the upsampler's time conv pads with zeros
            (batch, channels, _, height, width), dtype = repeats[slot]
            entry = like.new_zeros((batch, channels, CACHE_T, height, width), dtype=dtype)
        elif isinstance(entry, torch.Tensor) and entry.shape[2] < CACHE_T:
            missing = list(entry.shape)
            missing[2] = CACHE_T - entry.shape[2]
            entry = torch.cat([entry.new_zeros(missing), entry], 2)  # the zero padding its conv would add
        steady.append(entry)
    return steady


def _decode_head(vae, z):
    """Program A: latent frame 0 as stock decodes it, and the cache in its steady form."""
    if z.shape[2] != FIRST_FRAMES:
        raise ValueError(f"the first decode program takes latent frame 0 alone, got {z.shape[2]} frames")
    x = vae.post_quant_conv(z)
    cache, repeats = [None] * vae._cached_conv_counts["decoder"], {}
    with _first_frame_repeats(vae.decoder, repeats):
        out = vae.decoder(x, feat_cache=cache, feat_idx=[0], first_chunk=True)
    return out, _steady(cache, repeats)


def _decode_chunk(vae, z, cache):
    def frame(cache_, x):
        cache_ = list(cache_)
        return cache_, vae.decoder(x, feat_cache=cache_, feat_idx=[0])

    cache, out = _scan(frame, cache, vae.post_quant_conv(z), per_call=1)
    return out, cache


def _encode_first(vae, x):
    cache = [None] * vae._cached_conv_counts["encoder"]
    outs = [vae.encoder(x[:, :, :1], feat_cache=cache, feat_idx=[0])]
    if x.shape[2] > 1:
        outs.append(vae.encoder(x[:, :, 1:5], feat_cache=cache, feat_idx=[0]))
    return vae.quant_conv(torch.cat(outs, 2)), cache


def _encode_chunk(vae, x, cache):
    def call(cache_, frames):
        cache_ = list(cache_)
        return cache_, vae.encoder(frames, feat_cache=cache_, feat_idx=[0])

    cache, out = _scan(call, cache, x, per_call=4)
    return vae.quant_conv(out), cache


def _chunks(first, chunk_program, frames, head: int, end: int, per_chunk_frames: int, keep: int):
    """Run program A on ``frames[:, :, :head]``, then program B over ``frames[:, :, head:end]`` in calls of
    ``per_chunk_frames`` (the last zero-padded); trim to ``keep`` outputs of B. Every call's input is a slice of one
    array: the head and the chunks, when equal in length, share one slicing program."""
    array = backend.to_jax_array(frames)
    out, cache = first(backend.wrap(array[:, :, :head]))
    pieces = [out]
    if end > head:
        padded = head + math.ceil((end - head) / per_chunk_frames) * per_chunk_frames
        if padded > array.shape[2]:
            array = jnp.pad(array, ((0, 0), (0, 0), (0, padded - array.shape[2]), (0, 0), (0, 0)))
        produced = 0
        for start in range(head, padded, per_chunk_frames):
            out, cache = chunk_program(backend.wrap(array[:, :, start : start + per_chunk_frames]), cache)
            pieces.append(out)
            produced += out.shape[2]
        extra = produced - keep
        if extra:
            pieces[-1] = pieces[-1][:, :, : pieces[-1].shape[2] - extra]
    return torch.cat(pieces, 2)


def _finish(vae, out):
    """Stock ``_decode``'s tail: unpatchify (Wan 2.2's VAE), clamp to [-1, 1]."""
    if vae.config.patch_size is not None:
        out = unpatchify(out, patch_size=vae.config.patch_size)
    return torch.clamp(out, min=-1.0, max=1.0)


def _copy(cache: list) -> list:
    return [backend.wrap(jnp.copy(backend.to_jax_array(x))) if isinstance(x, torch.Tensor) else x for x in cache]


class StreamingDecoder:
    """Decodes a video block by block, carrying the causal feature cache: the concatenated outputs equal one
    stock ``vae.decode`` of all the latents (a causal conv only ever looks at its cached past frames).

    On JAX it reuses the VAE's compiled programs: latent frame 0 in program A, every later frame in the chunk program
    (cache carried, donated). The first block also runs the programs the next blocks need on zeros (on copies of the
    cache; once per block shape), so no block after the first compiles.
    """

    def __init__(self, vae):
        self.vae, self.cache, self.start = vae, None, 0
        self.programs = getattr(vae, "_diffusers_tpu_programs", None)
        self.rehearsal = None  # on JAX, after the first block: what a later block's decode returns (zeros' pixels)

    def _run(self, z, cache, start: int):
        if self.programs is None:  # plain torch: the stock per-frame loop
            return _decode_first(self.vae, z, cache, start)
        early = max(0, min(FIRST_FRAMES - start, z.shape[2]))
        pieces = []
        if early:
            out, cache = self.programs["decode_first"](z[:, :, :early])
            pieces.append(out)
        if z.shape[2] > early:
            out, cache = self.programs["decode_chunk"](z[:, :, early:], cache)
            pieces.append(out)
        return torch.cat(pieces, 2), cache

    def decode(self, z):
        """Pixels ``[B, C, frames, H, W]`` in [-1, 1] for the next latent frames ``z`` (normalized as
        ``vae.decode`` takes them)."""
        first = self.start == 0
        out, self.cache = self._run(z, self.cache, self.start)
        self.start += z.shape[2]
        rehearsed = self.programs["rehearsed"] if self.programs is not None else None
        if first and rehearsed is not None and (tuple(z.shape), z.dtype) not in rehearsed:
            rehearsed.add((tuple(z.shape), z.dtype))  # once per block shape: later calls find the programs built
            cache, start, zeros = _copy(self.cache), self.start, torch.zeros_like(z)
            while True:  # the next block's programs; one more when that block still holds a first frame
                rehearsed, cache = self._run(zeros, cache, start)
                start += z.shape[2]
                if start - z.shape[2] >= FIRST_FRAMES:
                    break
            self.rehearsal = _finish(self.vae, rehearsed)  # also compiles the tail ops at the later blocks' shape
        return _finish(self.vae, out)


class _Tiles:
    """``vae.enable_tiling()`` on JAX: stock's tiled decode/encode with every tile through the compiled chunk programs
    (two programs per tile shape; a frame grid has at most four tile shapes) and the blending and assembly as one
    compiled program of stock's own ``blend_v`` / ``blend_h`` code."""

    def __init__(self, vae, runtime, decode_frames, encode_frames):
        self.vae, self.runtime = vae, runtime
        self.decode_frames, self.encode_frames = decode_frames, encode_frames
        self.assemble = CompiledFunction(
            vae, functools.partial(_assemble, vae), state=dict, jax_context=runtime.jax_context
        )

    def decode(self, z, return_dict: bool = True):
        vae, ratio, patch = self.vae, self.vae.spatial_compression_ratio, self.vae.config.patch_size or 1
        _, _, _, height, width = z.shape
        tile_h, tile_w = vae.tile_sample_min_height // ratio, vae.tile_sample_min_width // ratio
        stride_h, stride_w = vae.tile_sample_stride_height // ratio, vae.tile_sample_stride_width // ratio
        with self.runtime.jax_context():
            rows = [
                [self.decode_frames(z[:, :, :, i : i + tile_h, j : j + tile_w]) for j in range(0, width, stride_w)]
                for i in range(0, height, stride_h)
            ]
            out = self.assemble(
                rows,
                vae.tile_sample_min_height // patch - vae.tile_sample_stride_height // patch,
                vae.tile_sample_min_width // patch - vae.tile_sample_stride_width // patch,
                vae.tile_sample_stride_height // patch,
                vae.tile_sample_stride_width // patch,
                height * ratio // patch,
                width * ratio // patch,
            )
            out = _finish(vae, out)
        return (out,) if not return_dict else DecoderOutput(sample=out)

    def encode(self, x):
        vae, ratio = self.vae, self.vae.spatial_compression_ratio // (self.vae.config.patch_size or 1)
        _, _, _, height, width = x.shape
        min_h, min_w = vae.tile_sample_min_height, vae.tile_sample_min_width
        latent_min_h, latent_min_w = min_h // ratio, min_w // ratio
        stride_h, stride_w = vae.tile_sample_stride_height // ratio, vae.tile_sample_stride_width // ratio
        with self.runtime.jax_context():
            rows = [
                [
                    self.encode_frames(x[:, :, :, i : i + min_h, j : j + min_w])
                    for j in range(0, width, vae.tile_sample_stride_width)
                ]
                for i in range(0, height, vae.tile_sample_stride_height)
            ]
            return self.assemble(
                rows,
                latent_min_h - stride_h,
                latent_min_w - stride_w,
                stride_h,
                stride_w,
                height // ratio,
                width // ratio,
            )


def _assemble(vae, rows, blend_height: int, blend_width: int, stride_h: int, stride_w: int, height: int, width: int):
    """Stock ``tiled_decode`` / ``tiled_encode``'s blending of overlapping tiles (diffusers 0.42)."""
    rows = [list(row) for row in rows]
    result_rows = []
    for i, row in enumerate(rows):
        result_row = []
        for j, tile in enumerate(row):
            if i > 0:
                tile = vae.blend_v(rows[i - 1][j], tile, blend_height)
            if j > 0:
                tile = vae.blend_h(row[j - 1], tile, blend_width)
            result_row.append(tile[:, :, :, :stride_h, :stride_w])
        result_rows.append(torch.cat(result_row, dim=-1))
    return torch.cat(result_rows, dim=3)[:, :, :, :height, :width]


def install(vae, runtime, state, place_input) -> None:
    """Replace ``vae._decode`` / ``vae._encode`` by the chunked, compiled versions (undone with the runtime)."""
    config = runtime.config
    dtype = None if config.vae_dtype is None else backend.jax_dtype(config.vae_dtype)
    options = dict(runtime.vae_program_options(), place_input=place_input)
    compile_ = functools.partial(CompiledFunction, vae, state=state, compute_dtype=dtype, **options)
    decode_first = compile_(functools.partial(_decode_head, vae))
    # The chunk programs update the carried cache (tensor arguments after the chunk itself) in place: the caller
    # never reads it again.
    decode_chunk = compile_(functools.partial(_decode_chunk, vae), donate=1)
    encode_first = compile_(functools.partial(_encode_first, vae))
    encode_chunk = compile_(functools.partial(_encode_chunk, vae), donate=1)
    stock_decode, stock_encode = vae._decode, vae._encode

    def decode_frames(z):  # stock's per-frame decoder loop (one cache), before unpatchify and clamp
        frames = z.shape[2]
        return _chunks(
            decode_first,
            decode_chunk,
            z,
            FIRST_FRAMES,
            frames,
            config.vae_decode_chunk,
            keep=vae.config.scale_factor_temporal * max(frames - FIRST_FRAMES, 0),
        )

    def encode_frames(x):  # stock's encoder loop (1 frame, then 4 at a time; one cache), quant_conv applied
        calls = 1 + (x.shape[2] - 1) // 4  # stock ignores frames past 1 + 4 * (calls - 1)
        head = min(x.shape[2], 5) if calls > 1 else 1
        end = 1 + 4 * (calls - 1) if calls > 2 else head
        return _chunks(encode_first, encode_chunk, x, head, end, 4 * config.vae_encode_chunk, keep=max(calls - 2, 0))

    def _decode(z, return_dict: bool = True):
        _, _, frames, height, width = z.shape
        tile_h = vae.tile_sample_min_height // vae.spatial_compression_ratio
        tile_w = vae.tile_sample_min_width // vae.spatial_compression_ratio
        if vae.use_tiling and (width > tile_w or height > tile_h):
            return stock_decode(z, return_dict=return_dict)  # -> vae.tiled_decode: compiled tiles below
        with runtime.jax_context():
            out = _finish(vae, decode_frames(z))
        return (out,) if not return_dict else DecoderOutput(sample=out)

    def _encode(x):
        _, _, frames, height, width = x.shape
        if vae.use_tiling and (width > vae.tile_sample_min_width or height > vae.tile_sample_min_height):
            return stock_encode(x)  # -> vae.tiled_encode: compiled tiles below
        with runtime.jax_context():
            if vae.config.patch_size is not None:
                x = patchify(x, patch_size=vae.config.patch_size)
            return encode_frames(x)

    runtime.overrides.set(vae, "_decode", _decode)
    runtime.overrides.set(vae, "_encode", _encode)
    tiles = _Tiles(vae, runtime, decode_frames, encode_frames)
    runtime.overrides.set(vae, "tiled_decode", tiles.decode)
    runtime.overrides.set(vae, "tiled_encode", tiles.encode)
    runtime.enter_public_vae_methods(vae)
    runtime.overrides.set(
        vae,
        "_diffusers_tpu_programs",
        {
            "decode_first": decode_first,
            "decode_chunk": decode_chunk,
            "encode_first": encode_first,
            "encode_chunk": encode_chunk,
            "rehearsed": set(),
        },
    )  # StreamingDecoder's block shapes
