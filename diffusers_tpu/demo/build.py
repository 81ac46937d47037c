"""The demo pipeline's parts that are built, not trained: a pixel VAE, the word tokenizer and a frozen text encoder.

The VAE is a stock ``AutoencoderKLWan`` whose weights are set by hand so that it is (to ~1e-5) a fixed resampler:
the latent is the video at half the width, height and frame rate, in RGB (``z_dim=3``). Decoding repeats each
latent pixel 2x2 and each latent frame twice (after the first, as Wan's causal VAE does: 1 + 2k frames);
encoding keeps every second pixel and frame (stock ``_encode`` reads frames in groups of 4 after the first, so it
takes 4k + 1 frames; generation only decodes). Every residual branch and the attention output are zero, so only the
input/output convolutions and the resamplers carry the signal. The two nonlinear heads (RMS norm over channels,
then SiLU) are made linear by riding the colours on a +20 offset next to a constant channel of 1e4: the norm then
divides by ~1e4 whatever the colour, and SiLU(x) = x for x near 20.
Training a real VAE on a CPU in the time budget is not possible; this one is exact enough that the transformer's
latents *are* (half-resolution) pixels, which is also what makes the demo's content easy to check.
"""

from __future__ import annotations

import json
import os

import torch
from diffusers import AutoencoderKLWan
from diffusers.models.autoencoders.autoencoder_kl_wan import WanAttentionBlock, WanResample, WanResidualBlock
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast, UMT5Config, UMT5EncoderModel

WORDS_PAD, WORDS_EOS, WORDS_UNK = "<pad>", "</s>", "<unk>"  # T5's special tokens
OFFSET, CONSTANT = 20.0, 1.0e4
VAE_CONFIG = dict(
    base_dim=8,
    z_dim=3,
    dim_mult=[1, 1],
    num_res_blocks=1,
    temperal_downsample=[True],
    latents_mean=[0.0] * 3,
    latents_std=[1.0] * 3,
    scale_factor_temporal=2,
    scale_factor_spatial=2,
)
# A frozen random UMT5 encoder (2 layers, width 32): the words only need distinct, stable embeddings.
TEXT_ENCODER = dict(
    vocab_size=64,
    d_model=32,
    d_kv=8,
    d_ff=64,
    num_layers=2,
    num_heads=4,
    relative_attention_num_buckets=8,
    relative_attention_max_distance=32,
    dropout_rate=0.0,
    feed_forward_proj="gated-gelu",
    is_encoder_decoder=False,
    pad_token_id=0,
    eos_token_id=1,
    decoder_start_token_id=0,
)


def word_tokenizer(words: list[str], model_max_length: int = 512):
    """A T5-style (pad=0, eos=1, unk=2, eos appended) word-level tokenizer over ``words``."""
    vocab = {WORDS_PAD: 0, WORDS_EOS: 1, WORDS_UNK: 2}
    for word in words:
        vocab.setdefault(word, len(vocab))
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token=WORDS_UNK))
    tokenizer.normalizer = normalizers.Lowercase()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation("removed")]
    )
    tokenizer.post_processor = processors.TemplateProcessing(single=f"$A {WORDS_EOS}", special_tokens=[(WORDS_EOS, 1)])
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        pad_token=WORDS_PAD,
        eos_token=WORDS_EOS,
        unk_token=WORDS_UNK,
        model_max_length=model_max_length,
    )


def portable_tokenizer(folder: str) -> None:
    """A saved pipeline's word tokenizer recorded as ``PreTrainedTokenizerFast``, the class transformers 4.57-5.x all
    load: transformers 5 saves it as ``TokenizersBackend``, which transformers 4 does not have (the same
    ``tokenizer.json`` either way)."""
    fast = "PreTrainedTokenizerFast"
    index_path = os.path.join(folder, "model_index.json")
    config_path = os.path.join(folder, "tokenizer", "tokenizer_config.json")
    index, config = _read(index_path), _read(config_path)
    index["tokenizer"] = ["transformers", fast]
    config["tokenizer_class"] = fast
    config.pop("backend", None)  # transformers 5's record of the class it saved
    _write(index_path, index)
    _write(config_path, config)


def _read(path: str) -> dict:
    with open(path) as handle:
        return json.load(handle)


def _write(path: str, value: dict) -> None:
    with open(path + ".partial", "w") as handle:
        json.dump(value, handle, indent=2, sort_keys=True)
        handle.write("\n")
    os.replace(path + ".partial", path)


def text_encoder(seed: int = 0):
    """A frozen random UMT5 encoder: distinct words give distinct embeddings, which is all the demo needs."""
    torch.manual_seed(seed)
    return UMT5EncoderModel(UMT5Config(**TEXT_ENCODER)).eval()


def _identity(conv: torch.nn.Module, pairs, scale: float = 1.0, tap=None) -> None:
    """Zero ``conv`` and connect output channel o to input channel i for (o, i) in ``pairs`` at the kernel's
    ``tap`` (default: the causal conv's current frame, spatial centre)."""
    weight = conv.weight
    with torch.no_grad():
        weight.zero_()
        if conv.bias is not None:
            conv.bias.zero_()
        if tap is None:
            tap = (
                (weight.shape[2] - 1,) + tuple(k // 2 for k in weight.shape[3:])
                if weight.ndim == 5
                else tuple(k // 2 for k in weight.shape[2:])
            )
        for out_channel, in_channel in pairs:
            weight[(out_channel, in_channel) + tuple(tap)] = scale


def _carrier(conv, rgb_in, offset: float) -> None:
    """``conv``: RGB channels ``rgb_in`` -> channels 0-2 plus ``offset``, channel 3 = CONSTANT."""
    _identity(conv, [(c, i) for c, i in zip(range(3), rgb_in)])
    with torch.no_grad():
        conv.bias[:3] = offset
        conv.bias[3] = CONSTANT


def _silence_branches(module: torch.nn.Module) -> None:
    for block in module.modules():
        if isinstance(block, WanResidualBlock):
            with torch.no_grad():
                block.conv2.weight.zero_()
                block.conv2.bias.zero_()
            if not isinstance(block.conv_shortcut, torch.nn.Identity):
                _identity(block.conv_shortcut, [(c, c) for c in range(block.conv_shortcut.in_channels)])
        elif isinstance(block, WanAttentionBlock):
            with torch.no_grad():
                block.proj.weight.zero_()
                block.proj.bias.zero_()


def _linear_head(norm, conv, rgb_out, extra=()) -> None:
    """Norm + SiLU + ``conv`` as a linear map: the norm's output is x * CONSTANT / |x| ~ x on carrier channels."""
    with torch.no_grad():
        norm.gamma.fill_(CONSTANT / norm.scale)
    _identity(conv, [(o, c) for o, c in zip(rgb_out, range(3))])
    with torch.no_grad():
        conv.bias[list(rgb_out)] = -OFFSET
        for out_channel, value in extra:
            conv.bias[out_channel] = value


def pixel_vae():
    """The hand-set ``AutoencoderKLWan`` described above (float32, eval mode)."""
    vae = AutoencoderKLWan(**VAE_CONFIG).eval()
    encoder, decoder = vae.encoder, vae.decoder
    _silence_branches(vae)
    # Encoder: carrier in, one downsample3d (keep pixel (2i, 2j); of each new frame pair keep the second), head
    # writes the mean (channels 0-2) and a log-variance of -30 (channels 3-5: a point posterior).
    _carrier(encoder.conv_in, range(3), OFFSET)
    for layer in encoder.modules():
        if isinstance(layer, WanResample):
            _identity(layer.resample[1], [(c, c) for c in range(4)], tap=(0, 0))
            _identity(layer.time_conv, [(c, c) for c in range(4)], tap=(2, 0, 0))
    _linear_head(encoder.norm_out, encoder.conv_out, range(3), extra=[(c, -30.0) for c in range(3, 6)])
    _identity(vae.quant_conv, [(c, c) for c in range(6)])
    _identity(vae.post_quant_conv, [(c, c) for c in range(3)])
    # Decoder: carrier in, one upsample3d (each frame twice after the first; nearest 2x2 then a centre tap).
    _carrier(decoder.conv_in, range(3), OFFSET)
    for layer in decoder.modules():
        if isinstance(layer, WanResample):
            half = layer.resample[1].out_channels
            _identity(layer.resample[1], [(c, c) for c in range(min(4, half))])
            copies = layer.time_conv.out_channels // 2
            _identity(layer.time_conv, [(c, c) for c in range(4)] + [(copies + c, c) for c in range(4)])
    _linear_head(decoder.norm_out, decoder.conv_out, range(3))
    return vae
