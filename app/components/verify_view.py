"""The Compare page's "Measured (verify)" view: a result of ``octopipe verify --json``, uploaded
or measured here, as a table beside the page's plans (their simulated step on this profile).

The pure parts (reading a result, the table, the bounds of a run here, the run itself) take no
Streamlit; ``view`` lays them out. Measuring is ``octopipe_core.verify.verify`` over the jobs
``octopipe_core.executor.verify`` exports, as ``octopipe verify`` does.
"""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import streamlit as st

from app.components import analysis, panels, state, uploads
from octopipe_core.commands.verify import ROUNDS_DEFAULT, RUN_TIMEOUT_S, STEPS, WARMUP, measure
from octopipe_core.errors import OctoPipeError
from octopipe_core.executor import verify as jobs
from octopipe_core.executor.export import DEFAULT_MODEL
from octopipe_core.jsonio import loads_checked
from octopipe_core.profile import Profile
from octopipe_core.verify import Candidate, Runner, VerifyResult

MAX_HERE_CANDIDATES = 6
MAX_HERE_STEPS = 200  # rounds x steps x candidates of one run here
MAX_HERE_RANKS = 16  # devices of a plan run here (one process each)
HERE_RUN_TIMEOUT_S = min(120.0, RUN_TIMEOUT_S)  # wall-clock limit of each run here
ROUNDS_HERE, STEPS_HERE, WARMUP_HERE = (1, 5), (1, 20), (0, 5)  # bounds of the form
MODEL_FIELDS = {  # export's model fields the form sets: label, bounds
    "hidden": ("hidden size (features)", 1, 4096),
    "seq": ("sequence length (tokens)", 1, 4096),
    "microbatch_size": ("micro-batch size (sequences)", 1, 256),
}
_RUNNING = threading.Lock()  # one measurement at a time on this machine, over all sessions


def one_line(msg: str, limit: int = 400) -> str:
    """``msg`` on one line (a launcher's log tail has newlines), at most ``limit`` characters.

    >>> one_line("a\\n  b")
    'a b'
    """
    text = " ".join(msg.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def read_result(raw: bytes, name: str) -> VerifyResult:
    """An uploaded ``verify --json`` output, checked (one-line ``OctoPipeError`` naming the
    file, the field and the fix); nothing in it runs."""
    return VerifyResult.from_dict(loads_checked(raw, name), name)


def match_plans(names: Sequence[str], choices: dict[str, str]) -> dict[str, str]:
    """Row name -> the page's plan of that name: the same key (peers such as
    ``zb-h1/balanced``), or a plan file's name without ``.json`` (``tuned.json`` -> ``tuned``).

    >>> match_plans(["tuned.json", "1f1b/balanced", "x.json"], {"tuned": "", "1f1b/balanced": ""})
    {'tuned.json': 'tuned', '1f1b/balanced': '1f1b/balanced'}
    """
    out = {}
    for n in names:
        key = n if n in choices else n.removesuffix(".json")
        if key in choices:
            out[n] = key
    return out


def speedup_text(res: VerifyResult, row: str, peer: str) -> str:
    """``1.08x (1.03-1.12), predicted 1.10x``: the measured speedup of ``row`` over ``peer``
    with its 95 % CI and the simulator's; ``-`` for the peer itself."""
    s = res.row(row).speedup_over.get(peer)
    if s is None:
        return "-"
    pred = f"{s.predicted:.2f}x" if math.isfinite(s.predicted) else "?"
    return f"{s.median:.2f}x ({s.ci95_lo:.2f}-{s.ci95_hi:.2f}), predicted {pred}"


def result_frame(res: VerifyResult, simulated_ms: dict[str, float]) -> pd.DataFrame:
    """The table: per row the measured best mark, name, source, predicted, the page's
    simulated step of the plan of that name (``simulated_ms``, blank without one), measured
    median, p25-p75, error and the speedups over every peer (rounded as ``to_dict``)."""
    rows = []
    for r in res.rows:
        row: dict[str, Any] = {
            "measured best": "★" if r.name == res.best else "",
            "candidate": r.name,
            "source": r.source,
            "predicted_ms": round(r.predicted_ms, 4),
            "simulated here_ms": simulated_ms.get(r.name, float("nan")),
            "measured_median_ms": round(r.measured_median_ms, 4),
            "p25-p75_ms": f"{r.p25_ms:,.1f}-{r.p75_ms:,.1f}",
            "error_%": round(r.error_pct, 3),
            "steps": r.steps,
        }
        for p in res.peers:
            row[f"vs {p} (x, 95% CI)"] = speedup_text(res, r.name, p)
        rows.append(row)
    return pd.DataFrame(rows)


def check_here(candidates: int, rounds: int, steps: int, devices: int) -> None:
    """Refuse a run here of more than ``MAX_HERE_CANDIDATES`` plans, ``MAX_HERE_STEPS`` steps
    (rounds x steps x candidates) or ``MAX_HERE_RANKS`` devices.

    >>> check_here(2, 5, 20, 2)
    >>> try:
    ...     check_here(3, 5, 20, 2)
    ... except OctoPipeError as e:
    ...     print(str(e).split(";")[0])
    verify here: 5 rounds x 20 steps x 3 plans is 300 steps, over the 200 the page runs
    """
    cli = "fix: run `octopipe verify` on the command line"
    if candidates < 1:
        raise OctoPipeError("verify here: no plan picked; fix: pick 1 to 6 plans to measure")
    if candidates > MAX_HERE_CANDIDATES:
        raise OctoPipeError(
            f"verify here: {candidates} plans, over the {MAX_HERE_CANDIDATES} the page runs; "
            f"fix: pick fewer, or {cli[5:]}"
        )
    total = rounds * steps * candidates
    if total > MAX_HERE_STEPS:
        raise OctoPipeError(
            f"verify here: {rounds} rounds x {steps} steps x {candidates} plans is {total} steps, "
            f"over the {MAX_HERE_STEPS} the page runs; fix: fewer rounds or steps, or {cli[5:]}"
        )
    if devices > MAX_HERE_RANKS:
        raise OctoPipeError(
            f"verify here: a plan on {devices} devices runs {devices} processes, over the "
            f"{MAX_HERE_RANKS} the page starts; fix: fewer devices, or {cli[5:]}"
        )


def candidates(picked: Sequence[str], choices: dict[str, str], profile: Profile) -> list[Candidate]:
    """The page's plans ``picked`` as candidates: peers (``schedule/partition``) as peers, the
    others (tuned, the Plan page's) as plans; each predicted on ``profile``."""
    peers = set(analysis.peer_keys())
    return [
        Candidate.of(n, analysis.plan_from_json(choices[n]), profile,
                     "peer" if n in peers else "plan")
        for n in picked
    ]  # fmt: skip


def run_here(
    cands: Sequence[Candidate],
    *,
    rounds: int,
    steps: int,
    warmup: int,
    model: dict[str, Any],
    progress: Callable[[str], None],
    runner: Callable[[list[Path], float, str], Runner] = jobs.LocalJobs,
) -> VerifyResult:
    """Export ``cands`` into a temporary work folder (removed after) with the same ``model``
    and run them here in ``rounds`` (``octopipe verify``'s settings otherwise); ``progress``
    gets verify's line after each run."""
    check_here(len(cands), rounds, steps, max((c.plan.num_devices for c in cands), default=0))
    res = measure(
        cands, rounds=rounds, model=model,
        runtime={"steps": steps, "warmup": warmup, "timeout_s": 45, "backend": "gloo"},
        run_timeout_s=HERE_RUN_TIMEOUT_S, progress=progress, runner=runner,
    )  # fmt: skip
    assert res is not None  # None only with export_only
    return res


def _plain(text: str) -> str:
    """``text`` shown as is in markdown (a file's text is never markup)."""
    return re.sub(r"([\\`*_{}\[\]()#+!|<>~$-])", r"\\\1", one_line(text, 300))


def _simulated(res: VerifyResult, choices: dict[str, str]) -> dict[str, float]:
    """Row name -> the simulated step (ms) of the page's plan of that name."""
    out = {}
    for row, key in match_plans([r.name for r in res.rows], choices).items():
        try:
            out[row] = round(float(state.plan_metrics(choices[key])["step_time_ms"]), 4)
        except OctoPipeError:
            continue
    return out


def show(res: VerifyResult, origin: str, choices: dict[str, str]) -> None:
    """The table of ``res`` with how to read it."""
    panels.frame(result_frame(res, _simulated(res, choices)), key="verify_table")
    st_ = res.settings
    counts = [st_.get(k) for k in ("rounds", "steps_per_round", "warmup_steps_per_round")]
    how = (
        "{} rounds x {} steps (after {} warm-up) per candidate, the order rotated each round. "
        .format(*counts)
        if all(isinstance(c, int) and not isinstance(c, bool) for c in counts)
        else ""
    )  # fmt: skip
    s = state.settings()
    st.caption(
        f"{origin}: {how}★ the measured best (lowest measured median). vs PEER: the peer's "
        f"measured median step / the candidate's (x) with its CI: {_plain(res.ci_method)}; "
        "predicted: the simulator's ratio. error\\_%: predicted / measured - 1. "
        f"simulated here\\_ms: the page's plan of that name (peers, tuned), simulated on "
        f"this profile ({_plain(state.profile().name)}, {s.devices} devices, {s.microbatches} "
        "micro-batches); blank where no plan here has that name."
    )


def _form_defaults(picked: Sequence[str], choices: dict[str, str]) -> None:
    ss = st.session_state
    if "verify_plans" in ss:
        ss["verify_plans"] = [p for p in ss["verify_plans"] if p in choices]
    else:
        ss["verify_plans"] = list(picked)[:MAX_HERE_CANDIDATES]


def _measure_here(choices: dict[str, str]) -> VerifyResult | None:
    """The run the form asked for, with a progress bar; refusals are one-line errors."""
    ss = st.session_state
    picked = list(ss["verify_plans"])
    rounds, steps, warmup = (int(ss[k]) for k in ("verify_rounds", "verify_steps", "verify_warmup"))
    model = {k: int(ss[f"verify_{k}"]) for k in MODEL_FIELDS}
    total = rounds * len(picked)
    if not _RUNNING.acquire(blocking=False):
        st.error("verify here: another session is measuring on this machine; fix: try again soon")
        return None
    try:
        cands = candidates(picked, choices, state.profile())
        devices = max((c.plan.num_devices for c in cands), default=0)
        check_here(len(cands), rounds, steps, devices)  # refused before the bar shows
        bar = st.progress(0.0, text=f"exporting {len(cands)} jobs")
        done = [0]

        def progress(line: str) -> None:
            done[0] += 1
            bar.progress(done[0] / total, text=f"{line} ({done[0]}/{total} runs)")

        res = run_here(
            cands, rounds=rounds, steps=steps, warmup=warmup, model=model, progress=progress
        )
    except OctoPipeError as e:
        st.error(one_line(str(e)))
        return None
    except Exception as e:  # never a traceback in the page
        st.error(one_line(f"verify here: {type(e).__name__}: {e}"))
        return None
    finally:
        _RUNNING.release()
    bar.progress(1.0, text=f"done: {total} runs, measured best {res.best}")
    return res


def view(choices: dict[str, str], picked: Sequence[str]) -> None:
    """Upload a verify result, or measure some of the page's plans here; then the table."""
    ss = st.session_state
    up = st.file_uploader(
        "verify result (JSON, from `octopipe verify PLAN.json --peers ... --json > verify.json`)",
        type=["json"],
        key="verify_upload",
    )
    uploaded = ss.get("verify_shown", (None, ""))[1].startswith("uploaded")
    if up is None:
        uploads.forget("verify_upload")
        if uploaded:  # the file was removed: its table goes too
            ss.pop("verify_shown")
    else:
        res = uploads.parse_new(up, "verify_upload", read_result)
        if res is not None:
            ss["verify_shown"] = (res, f"uploaded {_plain(up.name)}")
        elif ss.get("verify_upload_error") and uploaded:  # a bad file replaces a good one
            ss.pop("verify_shown")
        uploads.show_error("verify_upload")
    table = st.container()
    _form_defaults(picked, choices)
    with st.form("verify_form"):
        st.markdown("**Or measure the page's plans on this machine** (CPU, gloo, the CPU-small "
                    "model of `octopipe export`)")  # fmt: skip
        st.multiselect(f"plans to measure (1 to {MAX_HERE_CANDIDATES})", list(choices),
                       key="verify_plans")  # fmt: skip
        c1, c2, c3 = st.columns(3)
        c1.number_input("rounds (runs per plan)", *ROUNDS_HERE, ROUNDS_DEFAULT, key="verify_rounds")
        c2.number_input("timed steps per round (steps)", *STEPS_HERE, STEPS, key="verify_steps")
        c3.number_input("warm-up steps per round (steps)", *WARMUP_HERE, WARMUP,
                        key="verify_warmup")  # fmt: skip
        cols = st.columns(len(MODEL_FIELDS))
        for col, (k, (label, lo, hi)) in zip(cols, MODEL_FIELDS.items(), strict=True):
            col.number_input(label, lo, hi, int(DEFAULT_MODEL[k]), key=f"verify_{k}")
        go = st.form_submit_button("Run verify here", key="verify_run")
    st.caption(
        f"At most {MAX_HERE_CANDIDATES} plans and {MAX_HERE_STEPS} timed steps (rounds x steps x "
        f"plans); each run is a fresh `octopipe run` of the exported job (ranks pinned to cores, "
        f"{HERE_RUN_TIMEOUT_S:.0f} s limit). Larger runs: `octopipe verify` on the command line."
    )
    if go:
        res = _measure_here(choices)
        if res is not None:
            ss["verify_shown"] = (res, "measured here")
    with table:
        if ss.get("verify_shown"):
            res, origin = ss["verify_shown"]
            show(res, origin, choices)
        elif up is None:
            st.info("Upload a verify result, or measure plans here (below).")
