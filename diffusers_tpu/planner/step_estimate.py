"""An ESTIMATE of one denoising step's seconds on a TPU slice, from the TPU compiler's figures of the compiled step
(``hlo_stats``: FLOPs, bytes, collective bytes per device) and the chip's published peaks (``chips.Chip``); and the
ranking ``plan`` uses to pick the fastest candidate mesh that fits.

Model (a roofline, stated with every figure it prints): matmul and convolution FLOPs at the chip's bf16 peak; the
attention kernel's FLOPs (analytic: 4 x batch*heads x q x kv x head_dim, as padded; the cost model counts a Pallas
call as ~0) at ``attention_efficiency`` of that peak; every byte read or written at the HBM bandwidth; compute and
memory overlap (the larger counts); collective bytes at the chip's ICI bandwidth, all links together, not overlapped.
Not modelled: kernel launch and pipeline bubbles, collectives' latency and topology, the VAE and text encoders.
"""

from __future__ import annotations

from .chips import Chip

DEFAULT_ATTENTION_EFFICIENCY = 0.5  # an assumption, not a measurement: no TPU has run the exp2 kernel yet
NOT_MODELLED = "kernel launch, collectives' latency and topology, the VAE and text encoders"


def estimable(chip: Chip | None, tpu_compiled: bool) -> bool:
    """Whether a plan row gets an estimate: compiled by the TPU compiler, for a chip whose bandwidths are known."""
    return bool(chip and chip.hbm_gbps and chip.ici_gbps and tpu_compiled)


def estimate(step: dict, chip: Chip, attention_efficiency: float = DEFAULT_ATTENTION_EFFICIENCY) -> dict:
    """Seconds per step per device for one compiled step (``hlo_stats.summary``), with its parts and assumptions."""
    if not 0 < attention_efficiency <= 1:
        raise ValueError(f"attention_efficiency={attention_efficiency}: a fraction in (0, 1].")
    if not chip.hbm_gbps or not chip.ici_gbps:
        raise ValueError(f"{chip} has no published HBM or ICI bandwidth here: its steps cannot be estimated.")
    total = step["hlo"]["total"]
    peak = chip.peak_tflops * 1e12
    matmuls = total["flops"] / peak
    attention = total["attention_flops"] / (peak * attention_efficiency)
    memory = total["bytes"] / (chip.hbm_gbps * 1e9)
    collectives = sum(total.get("collective_bytes", {}).values()) / (chip.ici_gbps * 1e9)
    return {
        "seconds": max(matmuls + attention, memory) + collectives,
        "compute_seconds": matmuls + attention,
        "attention_seconds": attention,
        "memory_seconds": memory,
        "collective_seconds": collectives,
        "assumptions": {
            "peak_tflops": chip.peak_tflops,
            "hbm_gbps": chip.hbm_gbps,
            "ici_gbps": chip.ici_gbps,
            "attention_efficiency": attention_efficiency,
            "not modelled": NOT_MODELLED + _host_reads(step),
        },
    }


def _host_reads(step: dict) -> str:
    """Weights stored in host memory cross the host link every step: no bandwidth for it is published per chip."""
    hosted = step.get("host_argument_bytes", 0)
    if not hosted:
        return ""
    return f", moving {hosted / 2**30:.2f} GiB of weights from host memory per call of the step's program"


def of_passes(
    passes: list[dict], chip: Chip, attention_efficiency: float = DEFAULT_ATTENTION_EFFICIENCY, calls: int = 1
) -> dict:
    """The estimate of a step compiled as several programs (one runs per step: Wan 2.2's two experts): the slowest;
    ``calls``: how often the step's program runs per denoising step (2 when the guidance pair is not batched)."""
    found = max((estimate(step, chip, attention_efficiency) for step in passes), key=lambda e: e["seconds"])
    for key in ("seconds", "compute_seconds", "attention_seconds", "memory_seconds", "collective_seconds"):
        found[key] *= calls
    return dict(found, calls_per_step=calls)


TIE = 0.01  # estimates within 1% of the fastest are a tie: the earlier candidate in order of preference is taken


# what each kind of estimate is made of, for saying why a candidate won
PARTS = {
    "estimate": ("compute_seconds", "memory_seconds", "collective_seconds"),
    "compiler_estimate": ("xla_ops_seconds", "attention_seconds"),  # ``compiler_estimate.step``
}


def rank(rows: list[dict], by: str = "estimate") -> tuple[list[dict], dict, str]:
    """Rows with an estimate ``by`` (``PARTS``; in order of preference): (fastest first, the chosen row, why it was
    chosen)."""
    best = min(row[by]["seconds"] for row in rows)
    tied = [row for row in rows if row[by]["seconds"] <= best * (1 + TIE)]
    ranked = tied + sorted((row for row in rows if row not in tied), key=lambda row: row[by]["seconds"])
    chosen = tied[0]
    mesh = chosen["memory_per_device"]["mesh"]
    if len(rows) == 1:
        return ranked, chosen, f"mesh {mesh}: the only candidate that fits"
    if len(tied) > 1:
        return (
            ranked,
            chosen,
            (
                f"mesh {mesh}: {len(tied)} candidates are estimated within {TIE:.0%} of the fastest "
                f"({best:.3g} s/step), a tie; of them, the first in order of preference"
            ),
        )
    runner = ranked[1]
    a, b = chosen[by], runner[by]
    largest = max(PARTS[by], key=lambda part: b[part] - a[part])
    return (
        ranked,
        chosen,
        (
            f"mesh {mesh} is estimated {b['seconds'] - a['seconds']:.3g} s/step "
            f"({1 - a['seconds'] / b['seconds']:.0%}) "
            f"faster than the next, {runner['memory_per_device']['mesh']}, mostly by "
            f"{largest.replace('_seconds', '')} ({b[largest]:.3g} vs {a[largest]:.3g} s)"
        ),
    )


def describe(found: dict) -> str:
    """One line: the estimate, its parts, its assumptions, labelled as an estimate."""
    a = found["assumptions"]
    return (
        f"ESTIMATE {found['seconds']:.3g} s/step"
        + (f" ({found['calls_per_step']} calls of the step's program)" if found.get("calls_per_step", 1) > 1 else "")
        + f" (compute {found['compute_seconds']:.3g} s of which attention "
        f"{found['attention_seconds']:.3g} s, memory {found['memory_seconds']:.3g} s, collectives "
        f"{found['collective_seconds']:.3g} s; assuming {a['peak_tflops']:g} TFLOP/s bf16, {a['hbm_gbps']:g} GB/s HBM, "
        f"{a['ici_gbps']:g} GB/s ICI, attention at {a['attention_efficiency']:.0%} of peak)"
    )
