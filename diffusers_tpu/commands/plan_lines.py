"""The lines ``diffusers-tpu plan`` prints for its candidates: one per planned configuration, its memory per device
and verdict (and, with ``--compiler both``, the CPU estimate's error beside the TPU compiler's figures)."""

from __future__ import annotations

from ..planner.chips import GIB


def layout(row: dict) -> str:
    return (
        (" " + row["quantize"] if row["quantize"] else "")
        + (" fully sharded" if row.get("fully_sharded_weights") else "")
        + (" weights in host memory" if row.get("weights_in_host_memory") else "")
    )


def line(row: dict) -> str:
    memory = row["memory_per_device"]
    gib = lambda n: f"{n / GIB:7.2f}"  # noqa: E731
    verdict = {True: "fits", False: "does not fit", None: "?"}[row["fits"]]
    label = "[TPU compiler] " if row.get("compiler", "").startswith("TPU") else "[CPU estimate] "
    if row.get("step_effort") == "quick":
        label = "[TPU compiler, quick effort] "
    if row.get("refused"):
        return f"{label}mesh {memory['mesh']} {row['dtype']}{layout(row)}: refused by the compiler: {row['refused']}"
    decode, text = memory.get("vae_decode"), memory.get("text_encoders")
    return (
        f"{label}mesh {memory['mesh']} {row['dtype']}{layout(row)}: step "
        f"arguments {gib(memory['argument_bytes'])} GiB"
        + (f" (+{gib(memory['host_argument_bytes'])} in host memory)" if memory.get("host_argument_bytes") else "")
        + f", temporaries {gib(memory['temp_bytes'])}, outputs "
        f"{gib(memory['output_bytes'])}; VAE weights {gib(memory['vae_weight_bytes'])}"
        + (f", VAE decode peak {gib(decode['peak_bytes'])}" if decode else ", VAE decode not planned")
        + (f" (tiled: {gib(memory['vae_decode_tiled']['peak_bytes'])})" if memory.get("vae_decode_tiled") else "")
        + (
            f"; text encoders weights {gib(text['weight_bytes'])}, peak {gib(text['peak_bytes'])}"
            if text
            else "; text encoders on the host"
            if row.get("text_encoder") == "host"
            else ""
        )
        + f"; total {gib(row['total_bytes_per_device'])} of {row['hbm_gib']} GiB per device: {verdict}"
        + (" (the steps fit; the VAE decode does not)" if row["steps_fit"] and not row["fits"] else "")
        + (f"; ESTIMATE {row['estimate']['seconds']:.4g} s/step" if row.get("estimate") else "")
        + (estimate_line(row["cpu_estimate"]) if row.get("cpu_estimate") else "")
    )


def estimate_line(estimate: dict) -> str:
    error = estimate["error"]
    percent = lambda x: "n/a" if x is None else f"{x:+.0%}"  # noqa: E731
    return (
        f"\n    [CPU estimate] total {estimate['total_bytes_per_device'] / GIB:.2f} GiB "
        f"({percent(error['total_bytes_per_device'])}); step arguments {percent(error['argument_bytes'])}, "
        f"temporaries {estimate['temp_bytes'] / GIB:.2f} GiB ({percent(error['temp_bytes'])}), peak "
        f"{percent(error['peak_bytes'])} vs the TPU compiler"
    )
