"""Reading a compiled program's HLO: loops weighted by trip count, copies, custom calls, branches."""

import jax
import jax.numpy as jnp
import pytest

from diffusers_tpu.planner import hlo_stats, hlo_text


def test_a_loop_body_counts_once_per_iteration():
    def f(x, w):
        def body(i, h):
            return jnp.tanh(h @ w[i]).T  # a transpose: XLA keeps a copy or a transposing fusion per iteration

        return jax.lax.fori_loop(0, 5, body, x)

    compiled = jax.jit(f).lower(jnp.zeros((64, 64)), jnp.zeros((5, 64, 64))).compile()
    found = hlo_stats.stats(compiled.as_text())
    assert [loop.trip_count for loop in found.loops] == [5]
    body = found.loops[0].counts
    assert body.instructions > 0
    assert found.total.instructions == found.per_run.instructions + 4 * body.instructions
    assert found.total.fusions == found.per_run.fusions + 4 * body.fusions


def test_nested_loops_multiply_and_branches_count_once():
    def f(x, flag):
        def inner(j, h):
            return jax.lax.cond(flag, lambda v: jnp.sin(v) + j, lambda v: jnp.cos(v) * 2.0, h)

        return jax.lax.fori_loop(0, 3, lambda i, h: jax.lax.fori_loop(0, 4, inner, h) * 1.5, x)

    compiled = jax.jit(f).lower(jnp.zeros((8, 128)), True).compile()
    found = hlo_stats.stats(compiled.as_text())
    trips = sorted(loop.trip_count for loop in found.loops)
    assert trips == [3, 4]
    inner = next(loop for loop in found.loops if loop.trip_count == 4).counts
    outer = next(loop for loop in found.loops if loop.trip_count == 3).counts
    assert outer.instructions >= 4 * inner.instructions
    assert found.total.instructions >= 12 * inner.instructions


@pytest.mark.parametrize(
    "lhs, rhs, window",
    [
        ((2, 8, 16, 16), (4, 8, 3, 3), dict(window_strides=(1, 1), padding=((1, 1), (1, 1)))),
        ((2, 8, 17, 9), (4, 8, 3, 2), dict(window_strides=(2, 1), padding=((1, 2), (0, 1)))),
        # the TPU compiler's form of two dots sharing an operand: a window of 2 over a padded axis of 1 (one tap each)
        ((1, 8, 1, 5), (4, 8, 2, 1), dict(window_strides=(1, 1), padding=((1, 1), (0, 0)))),
        ((2, 4, 7, 7), (6, 4, 3, 3), dict(window_strides=(1, 1), padding=((2, 2), (2, 2)), lhs_dilation=(2, 2))),
        ((2, 4, 12, 12), (6, 4, 3, 3), dict(window_strides=(1, 1), padding=((2, 2), (0, 0)), rhs_dilation=(2, 1))),
    ],
)
def test_convolution_flops_count_the_taps_that_read_the_input_as_xla_does(lhs, rhs, window):
    """Padding and the holes of an input dilation are not multiplied: the figure equals XLA's own cost analysis
    (a padded window counted whole had doubled FasterCache's FFN FLOPs in a TPU program)."""
    lowered = jax.jit(lambda x, w: jax.lax.conv_general_dilated(x, w, **window)).lower(jnp.zeros(lhs), jnp.zeros(rhs))
    found = hlo_stats.stats(lowered.compile().as_text()).as_dict()["total"]["flops"]
    assert found == lowered.cost_analysis()["flops"] > 0


def test_shape_bytes():
    assert hlo_text.shape_bytes("bf16[2,3]{1,0}") == 12
    assert hlo_text.shape_bytes("(f32[4], s8[10], pred[])") == 16 + 10 + 1


HLO_WITH_A_MULTILINE_CONFIG = """HloModule m

%fused (p0: f32[4,8], p1: f32[8,16]) -> f32[4,16] {
  %p0 = f32[4,8]{1,0} parameter(0)
  %p1 = f32[8,16]{1,0} parameter(1)
  %inner = f32[4,16]{1,0} fusion(%p0, %p1), kind=kOutput, calls=%nested
  ROOT %r = f32[4,16]{1,0} negate(%inner)
}

%nested (q0: f32[4,8], q1: f32[8,16]) -> f32[4,16] {
  %q0 = f32[4,8]{1,0} parameter(0)
  %q1 = f32[8,16]{1,0} parameter(1)
  ROOT %d = f32[4,16]{1,0} dot(%q0, %q1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

ENTRY %main (a: f32[4,8], b: f32[8,16]) -> f32[4,16] {
  %a = f32[4,8]{1,0} parameter(0)
  %b = f32[8,16]{1,0} parameter(1)
  %k = f32[4,8]{1,0} custom-call(%a), custom_call_target="tpu_custom_call", backend_config={"custom_call_config":
"{\\"a\\": 1,
}}", metadata={op_name="kernel"}
  ROOT %f = f32[4,16]{1,0} fusion(%k, %b), kind=kOutput, calls=%fused
}
"""


def test_a_kernel_config_spanning_lines_and_nested_fusions_are_read():
    """A Pallas call's config may hold newlines (JAX's splash kernel: a line starting ``}}``), which must not end
    the computation; a matrix product in a fusion nested in a fusion is counted (the TPU compiler nests them)."""
    found = hlo_stats.stats(HLO_WITH_A_MULTILINE_CONFIG)
    assert found.total.custom_calls["tpu_custom_call"] == 1
    assert found.total.flops == 2 * 4 * 16 * 8
    assert found.total.fusions == 1


def test_bytes_count_what_slices_async_starts_and_in_place_updates_move():
    """A slice (and TPU memory-space assignment's ``slice-start`` pieces) reads only what it returns, an async start's
    result tuple repeats its operand beside its output, an in-place dynamic-update-slice touches only the update."""
    hlo = """HloModule m

ENTRY %main (p: s8[1000], q: f32[100], u: f32[10], i: s32[]) -> f32[100] {
  %p = s8[1000]{0} parameter(0)
  %q = f32[100]{0} parameter(1)
  %u = f32[10]{0} parameter(2)
  %i = s32[] parameter(3)
  %slice-start = ((s8[1000]{0}), s8[100]{0:S(1)}, s32[]{:S(2)}) slice-start(%p), slice={[0:100]}
  %slice-done = s8[100]{0:S(1)} slice-done(%slice-start)
  %slice.1 = s8[200]{0} slice(%p), slice={[0:200]}
  %copy-start = (f32[100]{0:S(1)}, f32[100]{0}, u32[]{:S(2)}) copy-start(%q)
  %copy-done = f32[100]{0:S(1)} copy-done(%copy-start)
  %dynamic-update-slice = f32[100]{0} dynamic-update-slice(%copy-done, %u, %i)
  ROOT %add = f32[100]{0} add(%dynamic-update-slice, %q)
}
"""
    found = hlo_stats.stats(hlo)
    slices = 2 * (100 + 4) + 2 * 200  # (a piece carries an s32 context)
    copy = 2 * 400 + 4
    update = 2 * 40
    add = 3 * 400
    assert found.total.bytes == slices + copy + update + add
