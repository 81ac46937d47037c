"""``plan``'s screening: every candidate's step compiled at XLA's quick effort (``tpu_compiler.quick_figures``: a
real-size step in about a quarter of the time, the same FLOPs and collectives), then, at full effort as the runtime
builds it, only the candidates whose full-effort figures could change the recommendation, judged by what the effort was
measured to change. Each row says which it is (``step_effort``)."""

from __future__ import annotations

import time

from ..planner import compiler_estimate
from ..planner.chips import GIB
from ..planner.plan import plan_all
from ..planner.step_estimate import rank
from . import plan_lines

# What XLA's effort changes in a step, measured as full-effort figures over quick-effort ones of the same steps (31
# candidate steps of five plans: Wan2.1-14B 720p and 480p, Wan2.1-1.3B, CogVideoX1.5-5B, HunyuanVideo-1.5 on v6e;
# BENCHMARKS "How long planning takes"), with a margin: its temporaries 0.47-1.34 (its arguments and outputs are the
# weights and inputs; the VAE's and text encoders' programs are compiled as the runtime builds them), the bytes its ops
# move 1.00-1.20 (its FLOPs and collectives are the partitioner's, the same at either effort)
FULL_OVER_QUICK_TEMPORARIES = (0.4, 1.6)
FULL_OVER_QUICK_BYTES = (0.97, 1.3)


def confirm_at_full_effort(pipe, call, devices, format_rows, rows, planned, start) -> None:
    """After a quick-effort screening: compile at full effort, as the runtime builds it, the candidates whose figures
    at full effort could change the recommendation (``to_confirm``), each row replaced, until none could. The other
    rows keep their quick-effort figures (labelled)."""
    hbm = (planned["chip"].usable_gib() if planned["chip"] else planned["hbm_gib"]) * GIB
    while True:
        todo = to_confirm(format_rows, hbm)
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


def to_confirm(rows: list[dict], hbm: float) -> list[dict]:
    """The quick-effort rows whose full-effort figures could change the recommendation: the leader, when its fit is
    in doubt or its estimate could rise past another's (``seconds_range``); then, against the leader's slowest, the
    others that could overtake it, fitting or (in doubt) not. When nothing fits: those whose fit is in doubt."""
    fitting = [row for row in rows if row["fits"]]
    if not fitting:
        return [row for row in rows if _quick(row) and fit_in_doubt(row, hbm)]
    leader = rank(fitting)[1]
    slowest = seconds_range(leader)[1]
    rivals = [
        row
        for row in rows
        if row is not leader
        and _quick(row)
        and row.get("estimate")
        and (row["fits"] or fit_in_doubt(row, hbm))
        and seconds_range(row)[0] < slowest
    ]
    if _quick(leader) and (fit_in_doubt(leader, hbm) or rivals and slowest > leader["estimate"]["seconds"]):
        return [leader]  # its own figures first, where the effort can move them: the rivals are measured against them
    return rivals


def quick_rows_note(rows: list[dict]) -> str:
    """What the ranking's quick-effort rows mean: why they were not compiled again at full effort."""
    if not any(_quick(row) for row in rows):
        return ""
    (low_t, high_t), (low_b, high_b) = FULL_OVER_QUICK_TEMPORARIES, FULL_OVER_QUICK_BYTES
    return (
        "; the [quick-effort compile] rows keep the screening's figures: with their temporaries anywhere in "
        f"{low_t:g}-{high_t:g}x and their bytes in {low_b:g}-{high_b:g}x (a full-effort compile's measured range, "
        "with a margin) the recommendation would be the same"
    )


def seconds_range(row: dict) -> tuple[float, float]:
    """A row's step estimate as its full-effort program could give it: the quick program's bytes scaled through
    ``FULL_OVER_QUICK_BYTES`` (a full-effort row: its own estimate)."""
    found = row["estimate"]
    if not _quick(row):
        return found["seconds"], found["seconds"]
    compute, memory, collectives = (found[k] for k in ("compute_seconds", "memory_seconds", "collective_seconds"))
    low, high = (max(compute, memory * ratio) + collectives for ratio in FULL_OVER_QUICK_BYTES)
    return low, high


def _quick(row: dict) -> bool:
    return row.get("step_effort") == "quick"


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
