"""Offline stand-ins for the hub files a pipeline needs but a plan never reads: tokenizers built with the
``tokenizers`` library (no download), and the scheduler settings the real-size CogVideoX pipelines ship.

``architectures`` builds real-size pipelines with them; the tiny test models (``testing``) reuse them.
"""

from __future__ import annotations

import string

from tokenizers import Regex, Tokenizer, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

PAD, EOS, UNK = "<pad>", "</s>", "<unk>"
# HunyuanVideo-1.5's system prompt length, which its stock pipeline crops from the text encoder's output
HUNYUAN15_TEMPLATE_TOKENS = 108
COGVIDEOX_SCHEDULER = dict(
    beta_schedule="scaled_linear",
    beta_start=0.00085,
    beta_end=0.012,
    clip_sample=False,
    prediction_type="v_prediction",
    rescale_betas_zero_snr=True,
    set_alpha_to_one=True,
    timestep_spacing="trailing",
)


def char_tokenizer(model_max_length: int = 512, special_tokens: dict[str, int] | None = None):
    """A T5-style (pad=0, eos=1, unk=2, eos appended) character tokenizer over printable ASCII; ``special_tokens``
    adds whole tokens at the ids a model expects (a vision-language model's image placeholder, say)."""
    vocab = {PAD: 0, EOS: 1, UNK: 2}
    for char in string.printable:
        vocab.setdefault(char, len(vocab))
    vocab.update(special_tokens or {})
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tokenizer.add_special_tokens(list(special_tokens or ()))  # matched whole, before the split into characters
    tokenizer.post_processor = processors.TemplateProcessing(single=f"$A {EOS}", special_tokens=[(EOS, 1)])
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, pad_token=PAD, eos_token=EOS, unk_token=UNK, model_max_length=model_max_length
    )


def chat_tokenizer(template_tokens: int = HUNYUAN15_TEMPLATE_TOKENS):
    """The character tokenizer with a chat template whose system part is exactly ``template_tokens`` tokens
    (what the stock HunyuanVideo-1.5 pipeline crops), followed by the user prompt."""
    tokenizer = char_tokenizer()
    width = template_tokens - 1
    tokenizer.chat_template = (
        "{% for m in messages %}{% if m['role'] == 'system' %}{{ (m['content'] ~ '"
        + " " * width
        + "')[:"
        + str(width)
        + "] }}|{% else %}{{ m['content'] }}{% endif %}{% endfor %}"
    )
    return tokenizer
