"""``plan``'s screening: every candidate's step compiled at XLA's quick effort (``tpu_compiler.quick_figures``: a
real-size step in about a quarter of the time, the same FLOPs and collectives), then, at full effort as the runtime
builds it, only the candidates that could still win or whose fit is in doubt. Each row says which it is
(``step_effort``)."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

from ..planner.chips import GIB
from ..planner.plan import plan_all, start_plan
from ..planner.step_estimate import rank
from . import plan_lines

# A quick-effort program's memory is not the runtime's full-effort one (Wan2.1-14B 720p step on v6e-8: temporaries
# 3.53 GiB quick, 2.81 full; a VAE program's could be half): a screened candidate whose total lies in this band around
# the memory is confirmed at full effort before it is recommended (or, when none fits, in case it fits after all)
DOUBTFUL_FIT = (0.85, 1.25)
# only the bytes term of the estimate depends on the effort (FLOPs and collectives are the partitioner's): a
# memory-bound candidate within this much of the leader could still overtake it at full effort
EFFORT_UNCERTAINTY = 0.05


def _to_confirm(format_rows, planned) -> list:
    """The rows a full-effort compile must confirm now: the leader if its fit is in doubt, and the memory-bound
    candidates close enough to overtake it; with nothing fitting, those whose fit is in doubt."""
    hbm = (planned["chip"].usable_gib() if planned["chip"] else planned["hbm_gib"]) * GIB
    low, high = DOUBTFUL_FIT

    def doubtful(row) -> bool:
        return row.get("step_effort") == "quick" and low * hbm <= (row["total_bytes_per_device"] or 0) <= high * hbm

    fitting = [row for row in format_rows if row["fits"]]
    if not fitting:
        return [row for row in format_rows if doubtful(row)]
    leader = rank(fitting)[1]
    best = leader["estimate"]["seconds"]
    return ([leader] if doubtful(leader) else []) + [
        row
        for row in fitting
        if row.get("step_effort") == "quick"
        and row is not leader
        and row["estimate"]["memory_seconds"] >= row["estimate"]["compute_seconds"]
        and row["estimate"]["seconds"] <= best * (1 + EFFORT_UNCERTAINTY)
    ]


class EarlyConfirmations:
    """Full-effort confirmations started while the screening's last rows still compile: after each row, the rows
    that would need confirming among those in so far are traced (on the calling thread, which the screening no
    longer uses: it traced every candidate up front) and compiled on a thread of their own. The confirmation waits
    for them instead of starting over; one whose row stops mattering is left unread."""

    def __init__(self, pipe, call, devices, planned):
        self.pipe, self.call, self.devices, self.planned = pipe, call, devices, planned
        self.started: dict[int, object] = {}
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="diffusers_tpu-plan-confirm")

    def after_row(self, format_rows) -> None:
        for row in _to_confirm(format_rows, self.planned):
            if id(row) not in self.started:
                planned = self.planned
                self.started[id(row)] = start_plan(
                    self.pipe,
                    self.call,
                    row["config"],
                    self.devices,
                    planned["chip"],
                    planned["hbm_gib"],
                    planned["text_tokens"],
                    compiler=self.pool,
                    vae=planned.get("vae", True),
                    attention_efficiency=planned["attention_efficiency"],
                )

    def take(self, row):
        """The started confirmation of ``row`` (a callable giving its full-effort row), or None."""
        return self.started.pop(id(row), None)

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


def confirm_at_full_effort(pipe, call, devices, format_rows, rows, planned, start, early=None) -> None:
    """After a quick-effort screening: compile at full effort, as the runtime builds it, the candidates that could
    still win or whose fit is in doubt (``DOUBTFUL_FIT``, ``EFFORT_UNCERTAINTY``), each row replaced, until the
    first-ranked candidate needs no confirmation. The other rows keep their quick-effort figures (labelled). ``early``:
    the ``EarlyConfirmations`` started during the screening, used where they match."""
    while True:
        todo = _to_confirm(format_rows, planned)
        if not todo:
            return
        for row in todo:
            config = row["config"]
            started = early.take(row) if early is not None else None
            confirmed = started() if started is not None else next(plan_all(pipe, call, [config], devices, **planned))
            confirmed.update(compiler=row["compiler"], config=config)
            if "cpu_estimate" in row:
                confirmed["cpu_estimate"] = row["cpu_estimate"]
            format_rows[format_rows.index(row)] = rows[rows.index(row)] = confirmed
            print(
                f"[confirmed at full effort, {time.perf_counter() - start:.0f} s] {plan_lines.line(confirmed)}",
                flush=True,
            )
