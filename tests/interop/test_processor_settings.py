"""A processor's plain settings select the program (``module_state.settings_key``): Python values are constants
in a trace, so a setting changed between calls (IP-Adapter's ``set_ip_adapter_scale``) is traced anew, as stock
reads it at every call — on a plain processor and on one that is a module (IP-Adapter's are)."""

import numpy as np
import pytest
import torch
from diffusers.models.transformers.transformer_wan import WanAttnProcessor

from diffusers_tpu.interop import compile_accounting
from diffusers_tpu.testing import tiny
from tests.conftest import assert_np_matches, generate


class Gain(WanAttnProcessor):
    """Stock attention times ``gain`` (a plain setting, as IP-Adapter's ``scale``)."""

    def __init__(self):
        super().__init__()
        self.gain = [1.0]

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, rotary_emb=None):
        out = super().__call__(attn, hidden_states, encoder_hidden_states, attention_mask, rotary_emb)
        return out * self.gain[0]


class ModuleGain(torch.nn.Module):
    """The same as a module (IP-Adapter's processors are), with a buffer beside its setting."""

    def __init__(self):
        super().__init__()
        self.inner, self.gain = WanAttnProcessor(), [1.0]
        self.register_buffer("unit", torch.ones(()))

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, rotary_emb=None):
        out = self.inner(attn, hidden_states, encoder_hidden_states, attention_mask, rotary_emb)
        return out * self.gain[0] * self.unit


@pytest.mark.parametrize("kind", [Gain, ModuleGain])
def test_a_changed_processor_setting_is_traced_anew(kind):
    pipe = tiny.wan_pipeline("wan-4head")
    processor = kind()
    pipe.transformer.blocks[0].attn2.set_processor(processor)
    stock = {}
    for gain in (1.0, 3.0):
        processor.gain[0] = gain
        stock[gain] = generate(pipe, output_type="np")
    assert np.abs(stock[3.0] - stock[1.0]).max() > 1e-2  # the setting matters
    pipe.to("jax")
    assert pipe.transformer.blocks[0].attn2.processor is processor
    for gain in (1.0, 3.0, 1.0):
        processor.gain[0] = gain
        assert_np_matches(generate(pipe, output_type="np"), stock[gain])
    with compile_accounting.compile_log() as log:  # both settings traced: a repeat compiles nothing
        processor.gain[0] = 3.0
        generate(pipe, output_type="np")
    assert log.compilations == 0
    pipe.to("cpu")


def test_freeu_enabled_after_the_first_call_is_traced_anew():
    """``enable_freeu`` after a moved UNet pipeline's first call: FreeU's factors (plain attributes of the UNet's up
    blocks) select the program, so the image is stock's with FreeU, and ``disable_freeu`` gives the plain one back
    without compiling."""
    from diffusers_tpu.testing import tiny_unet

    pipe, call = tiny_unet.pipeline("sd")
    call = dict(call, output_type="np")
    run = lambda: pipe(**call, generator=torch.Generator().manual_seed(0)).images  # noqa: E731
    plain = run()
    pipe.enable_freeu(s1=0.9, s2=0.2, b1=1.2, b2=1.4)
    freeu = run()
    pipe.disable_freeu()
    assert np.abs(freeu - plain).max() > 1e-3  # FreeU changes the image on stock
    pipe.to("jax")
    assert_np_matches(run(), plain)
    pipe.enable_freeu(s1=0.9, s2=0.2, b1=1.2, b2=1.4)
    assert_np_matches(run(), freeu)
    pipe.disable_freeu()
    with compile_accounting.compile_log() as log:
        assert_np_matches(run(), plain)
    assert log.compilations == 0
    pipe.to("cpu")
