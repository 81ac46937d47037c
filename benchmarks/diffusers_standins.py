"""A pytest plugin for running diffusers' own tests offline, on stock torch or on the JAX device: Hub-only test
models are answered by local stand-ins of the same shape, built by the project's code (no download, no remote
code). Loaded by ``benchmarks/diffusers_conformance.py`` (``-p benchmarks.diffusers_standins``).

``DIFFUSERS_CONFORMANCE_BACKEND=jax`` imports ``diffusers_tpu`` before any test (the JAX device then exists);
anything else leaves diffusers stock. Stand-ins differ from the Hub files in values (a tiny random T5's weights,
a character tokenizer): a test asserting the Hub model's exact outputs (``test_inference``'s expected slices) fails
on both devices alike, which the conformance table shows as such. On ``jax`` it also enters that device in the
tests' per-device backend tables (``_known_to_the_tests``).
"""

from __future__ import annotations

import functools
import json
import os
import sys
from pathlib import Path
from unittest import mock

import torch

BACKEND = os.environ.get("DIFFUSERS_CONFORMANCE_BACKEND", "cpu")

# the configurations of the Hub's tiny test models, as published (values, not files)
TINY_RANDOM_T5 = dict(
    d_model=32,
    d_ff=37,
    d_kv=8,
    num_heads=4,
    num_layers=5,
    num_decoder_layers=5,
    vocab_size=1103,
    relative_attention_num_buckets=8,
    dropout_rate=0.1,
    feed_forward_proj="relu",
    is_encoder_decoder=True,
    pad_token_id=0,
    eos_token_id=1,
    decoder_start_token_id=0,
)
TINY_RANDOM_SIGLIP = dict(
    hidden_size=32, intermediate_size=37, num_attention_heads=4, num_hidden_layers=2, image_size=30, patch_size=2
)


# the chat format of the Hub's tiny Qwen2-VL tokenizer (Z-Image formats its prompts with it)
QWEN_CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _tokenizer(model_max_length: int, chat_template: str | None = None):
    from diffusers_tpu.planner.standins import char_tokenizer

    tokenizer = char_tokenizer(model_max_length=model_max_length)
    tokenizer.chat_template = chat_template
    return tokenizer


# the ids the Qwen2-VL / Qwen2.5-VL configurations give their chat and vision tokens
QWEN_VL_SPECIAL_TOKENS = {
    "<|endoftext|>": 151643,
    "<|im_start|>": 151644,
    "<|im_end|>": 151645,
    "<|vision_start|>": 151652,
    "<|vision_end|>": 151653,
    "<|vision_pad|>": 151654,
    "<|image_pad|>": 151655,
    "<|video_pad|>": 151656,
}


def _qwen_vl_processor(cls):
    """The Hub's tiny Qwen2-VL processor: the image processor's defaults and a tokenizer whose chat and vision
    tokens are whole tokens at the model's ids (the processor expands ``<|image_pad|>`` to one per image patch)."""
    from transformers import Qwen2VLImageProcessor

    from diffusers_tpu.planner.standins import char_tokenizer

    tokenizer = char_tokenizer(model_max_length=1024, special_tokens=QWEN_VL_SPECIAL_TOKENS)
    tokenizer.chat_template = QWEN_CHAT_TEMPLATE
    return _without_video(cls)(image_processor=Qwen2VLImageProcessor(), tokenizer=tokenizer)


@functools.cache
def _without_video(cls):
    """``cls`` without its video processor: transformers' needs torchvision, which has no wheel for this torch, and
    images are all these pipelines give it. Same name and module, so a pipeline saves it as ``cls``; saved, it has
    no video processor, and ``_answer`` loads such a folder back with this class."""
    from transformers import ProcessorMixin

    class Standin(cls):
        def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
            # the class check would refuse the character tokenizer
            with mock.patch.object(ProcessorMixin, "check_argument_for_proper_class", lambda self, name, arg: None):
                super().__init__(image_processor, tokenizer, None, chat_template=chat_template, **kwargs)
            self.video_processor = None

    Standin.__name__, Standin.__qualname__, Standin.__module__ = cls.__name__, cls.__qualname__, cls.__module__
    return Standin


def _saved_without_video(cls, name) -> bool:
    config = Path(str(name)) / "processor_config.json"
    return (
        "video_processor" in cls.get_attributes()
        and config.is_file()
        and "video_processor" not in json.loads(config.read_text())
    )


def _seeded(build):
    """``build()`` under seed 0 without moving the caller's global RNG (tests seed around their loads)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return build()


def _t5_config():
    from transformers import T5Config

    return T5Config(**TINY_RANDOM_T5)


def _t5_model(cls):
    config = _t5_config()
    return _seeded(lambda: cls(config).eval())


def _qwen2_vl(cls):
    """A Qwen2-VL of the Hub's tiny test model's text width (16: EasyAnimate's tests size their transformer to it)."""
    from transformers import Qwen2VLConfig

    text = dict(
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=1000,
        max_position_embeddings=1024,
        rope_scaling=dict(type="mrope", mrope_section=[1, 1, 0]),
        bos_token_id=1,
        eos_token_id=1,
    )
    vision = dict(depth=1, embed_dim=16, hidden_size=16, num_heads=2, patch_size=14, spatial_merge_size=2)
    config = Qwen2VLConfig(text_config=text, vision_config=vision, vocab_size=1000, hidden_size=16)
    return _seeded(lambda: cls(config).eval())


def _gemma3(cls):
    """A tiny Gemma-3 of the Hub's tiny test model's text width (32: LTX-2's tests size their text connectors'
    attention, 4 heads of 8, to it)."""
    from diffusers_tpu.testing.tiny_ltx import gemma3_config

    return _seeded(lambda: cls(gemma3_config(hidden_size=32, max_positions=1024)).eval())


def _siglip(cls):
    from transformers import SiglipVisionConfig

    return _seeded(lambda: cls(SiglipVisionConfig(**TINY_RANDOM_SIGLIP)).eval())


# repository -> what each kind of load answers with
STANDINS = {
    "hf-internal-testing/tiny-random-t5": {
        "config": _t5_config,
        "tokenizer": lambda: _tokenizer(512),
        "model": _t5_model,
    },
    "hf-internal-testing/tiny-random-clip": {"tokenizer": lambda: _tokenizer(77)},
    "hf-internal-testing/tiny-random-Qwen2VLForConditionalGeneration": {
        "tokenizer": lambda: _tokenizer(1024, QWEN_CHAT_TEMPLATE),
        "model": _qwen2_vl,
        "processor": _qwen_vl_processor,
    },
    "finetrainers/dummy-hunyaunvideo": {"tokenizer": lambda: _tokenizer(256)},
    "hf-internal-testing/tiny-gemma3": {"tokenizer": lambda: _tokenizer(1024), "model": _gemma3},
    "hf-internal-testing/tiny-random-SiglipVisionModel": {
        "model": _siglip,
        "image_processor": lambda cls, **kwargs: cls(**kwargs),  # the class's defaults, the test's size
    },
}


def _answer(kind: str, original, cls, name, args, kwargs):
    standin = STANDINS.get(str(name), {}).get(kind)
    if kind == "processor" and standin is None and _saved_without_video(cls, name):
        return original(_without_video(cls), name, *args, **kwargs)
    if standin is None:
        return original(cls, name, *args, **kwargs)
    if kind == "image_processor":
        return standin(cls, **kwargs)
    return standin(cls) if kind in ("model", "processor") else standin()


def _patch(owner, kind: str) -> None:
    original = owner.from_pretrained.__func__

    @functools.wraps(original)
    def from_pretrained(cls, name, *args, **kwargs):
        return _answer(kind, original, cls, name, args, kwargs)

    owner.from_pretrained = classmethod(from_pretrained)


if BACKEND == "jax":  # at import, before the checkout's conftest reads DIFFUSERS_TEST_DEVICE
    import diffusers_tpu

    diffusers_tpu.activate()


def pytest_configure(config):
    import transformers

    _patch(transformers.AutoConfig, "config")
    _patch(transformers.PretrainedConfig, "config")
    _patch(transformers.AutoTokenizer, "tokenizer")
    _patch(transformers.PreTrainedTokenizerBase, "tokenizer")
    _patch(transformers.PreTrainedModel, "model")
    _patch(transformers.image_processing_base.ImageProcessingMixin, "image_processor")
    _patch(transformers.ProcessorMixin, "processor")


def pytest_collection_finish(session):
    if BACKEND == "jax":
        _known_to_the_tests(os.environ.get("DIFFUSERS_TEST_DEVICE", "jax"))


def _known_to_the_tests(device: str) -> None:
    """diffusers' tests dispatch per device name through tables (``BACKEND_EMPTY_CACHE``, ``BACKEND_MANUAL_SEED``,
    ...) in their ``testing_utils``; a name not in a table gets its ``"default"``. Up to v0.38 the dispatcher called
    that default even where it is ``None`` (every test's ``setUp`` raised ``TypeError``); v0.39 returns it. The JAX
    device is entered with each table's default, which every version then dispatches as v0.39+ does — what a
    ``DIFFUSERS_TEST_DEVICE_SPEC`` file would do, whose module the checkout itself would have to hold."""
    for module in list(sys.modules.values()):
        if not getattr(module, "__name__", "").endswith("testing_utils"):
            continue
        for name, table in list(vars(module).items()):
            if name.startswith("BACKEND_") and isinstance(table, dict) and "default" in table:
                table.setdefault(device, table["default"])


def pytest_report_header(config):
    import diffusers

    return f"diffusers {diffusers.__version__} from {os.path.dirname(diffusers.__file__)}; backend {BACKEND}"
