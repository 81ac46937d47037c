"""``plan``'s screening: every candidate's step compiled at XLA's quick effort (``tpu_compiler.quick_figures``: a
real-size step in about a quarter of the time, the same FLOPs and collectives), then, at full effort as the runtime
builds it, only the candidates that could still win or whose fit is in doubt. Each row says which it is
(``step_effort``)."""

from __future__ import annotations

import time

from ..planner import compiler_estimate
from ..planner.chips import GIB
from ..planner.plan import plan_all
from ..planner.step_estimate import rank
from . import plan_lines

# Only the step's temporaries depend on XLA's effort (its arguments and outputs are the weights and inputs; the VAE's
# and text encoders' programs are compiled as the runtime builds them): full-effort temporaries over quick-effort ones,
# measured on the same steps, ranged 0.80-1.27 (BENCHMARKS "How long planning takes"). A screened candidate whose fit
# would change with its temporaries anywhere in this range is confirmed at full effort before it is recommended (or,
# when none fits, in case it fits after all)
FULL_OVER_QUICK_TEMPORARIES = (0.5, 1.6)
# only the bytes term of the estimate depends on the effort (FLOPs and collectives are the partitioner's): a
# memory-bound candidate within this much of the leader could still overtake it at full effort
EFFORT_UNCERTAINTY = 0.05


def confirm_at_full_effort(pipe, call, devices, format_rows, rows, planned, start) -> None:
    """After a quick-effort screening: compile at full effort, as the runtime builds it, the candidates that could
    still win or whose fit is in doubt (``fit_in_doubt``, ``EFFORT_UNCERTAINTY``), each row replaced, until the
    first-ranked candidate needs no confirmation. The other rows keep their quick-effort figures (labelled)."""
    hbm = (planned["chip"].usable_gib() if planned["chip"] else planned["hbm_gib"]) * GIB

    def doubtful(row) -> bool:
        return row.get("step_effort") == "quick" and fit_in_doubt(row, hbm)

    while True:
        fitting = [row for row in format_rows if row["fits"]]
        if fitting:
            leader = rank(fitting)[1]
            best = leader["estimate"]["seconds"]
            todo = [leader] if doubtful(leader) else []
            todo += [
                row
                for row in fitting
                if row.get("step_effort") == "quick"
                and row is not leader
                and row["estimate"]["memory_seconds"] >= row["estimate"]["compute_seconds"]
                and row["estimate"]["seconds"] <= best * (1 + EFFORT_UNCERTAINTY)
            ]
        else:
            todo = [row for row in format_rows if doubtful(row)]
        if not todo:
            return
        for row in todo:
            config = row["config"]
            confirmed = next(plan_all(pipe, call, [config], devices, **planned))
            confirmed.update(compiler=row["compiler"], config=config)
            if "cpu_estimate" in row:
                confirmed["cpu_estimate"] = row["cpu_estimate"]
            format_rows[format_rows.index(row)] = rows[rows.index(row)] = confirmed
            print(
                f"[confirmed at full effort, {time.perf_counter() - start:.0f} s] {plan_lines.line(confirmed)}",
                flush=True,
            )


def fit_in_doubt(row: dict, hbm: float) -> bool:
    """Whether a quick-effort row's verdict could change at full effort: its step's temporaries scaled through
    ``FULL_OVER_QUICK_TEMPORARIES`` (every pass of the step), beside its exact figures (the decode's, the text
    encoders'), land on both sides of ``hbm`` bytes. A row the compiler refused has no figures to scale: not in
    doubt."""
    if row["total_bytes_per_device"] is None:
        return False
    memory = row["memory_per_device"]
    around = row["steps_bytes_per_device"] - memory["peak_bytes"]  # the VAE's and text encoders' weights beside
    exact = max(row["decode_bytes_per_device"] or 0, row["text_encode_bytes_per_device"] or 0)
    low, high = (
        max(exact, around + max(p["peak_bytes"] + (ratio - 1) * p["temp_bytes"] for p in memory["passes"]))
        for ratio in FULL_OVER_QUICK_TEMPORARIES
    )
    return low <= hbm < high


def ranked_by(pipe, call, devices, rows, planned, compiler: bool) -> str:
    """What ranks the fitting ``rows``: the step ESTIMATE, or (``--compiler-estimate``) the TPU compiler's own, every
    row estimated first (the ESTIMATE where libtpu gave none for a row)."""
    if not compiler:
        return "estimate"
    compiler_estimates(pipe, call, devices, rows, planned)
    return "compiler_estimate" if all(row["compiler_estimate"] for row in rows) else "estimate"


def compiler_estimates(pipe, call, devices, rows, planned) -> None:
    """``--compiler-estimate``: each row's step estimated from the TPU compiler's own figures
    (``compiler_estimate.step``: one quick-effort compile per block list, plus one, of the step cut to 1 and 2 blocks),
    kept as ``row["compiler_estimate"]`` (None where libtpu gives none)."""
    for number, row in enumerate(rows, 1):
        memory = row["memory_per_device"]
        print(
            f"the TPU compiler's own estimate {number}/{len(rows)}: mesh {memory['mesh']}, the step cut to 1 and 2 "
            "blocks ...",
            flush=True,
        )
        attention = compiler_estimate.attention_flops(memory["passes"])
        row["compiler_estimate"] = compiler_estimate.step(
            pipe,
            call,
            row["config"],
            devices,
            planned["text_tokens"],
            planned["chip"],
            attention,
            planned["attention_efficiency"],
            memory["calls_per_step"],
        )
