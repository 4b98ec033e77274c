"""Export page: the runnable job (zip), PyTorch's schedule CSV, a Chrome trace, the plan JSON."""

from __future__ import annotations

import streamlit as st

from app.components import analysis, exporting, state
from octopipe_core.errors import OctoPipeError

st.title("Export")
prof = state.profile()
try:
    choices = state.plan_choices()
except OctoPipeError as e:
    st.error(str(e))
    st.stop()
names = list(choices)
if not names:
    st.error("No plan can be built for these settings; fix: use fewer devices.")
    st.stop()
# the session's tuned plan, else a hand-edited plan, else the quick tuned plan, else the first
prefer = [n for n in names if n == "tuned"]
prefer += [n for n in names if n.startswith("plan page") and n.endswith("+edits")]
prefer += [n for n in names if n == state.AUTO_TUNED]
default = names.index(prefer[0]) if prefer else 0
pick = st.selectbox("plan to export", names, index=default, key="export_pick")
js = choices[pick]
plan = analysis.plan_from_json(js)
base = exporting.safe_name(f"{prof.name}-{plan.name or pick}")
m = state.plan_metrics(js)
st.caption(
    f"{plan.name}: {plan.num_devices} devices, {plan.num_stages} stages, "
    f"{plan.num_microbatches} micro-batches; simulated step {m['step_time_ms']:,.1f} ms, "
    f"peak memory {m['max_peak_memory_gib']:.1f} GiB."
)

st.download_button(
    "Download plan (JSON, profile embedded)",
    exporting.plan_file_json(plan, prof),
    file_name=f"{base}.json",
    mime="application/json",
    on_click="ignore",
    key="dl_plan",
)


mod, why = exporting.exporter()
if mod is None:
    st.warning(f"Only the plan JSON can be exported here: {why}.")
    st.stop()
try:
    with st.spinner("writing the job"):
        data, files = state.cached_job(prof, js, base)
    csv = exporting.torch_schedule_csv(plan)
    trace = exporting.chrome_trace(prof, plan)
except Exception as e:  # the exporter is separate code: report, never a traceback
    st.error(f"Export failed: {type(e).__name__}: {e}")
    st.stop()
st.download_button(
    "Download runnable job (zip)",
    data,
    file_name=f"{base}.zip",
    mime="application/zip",
    on_click="ignore",
    type="primary",
    key="dl_zip",
)
st.caption(
    "Unzip and run `./launch.sh` (torchrun, single node; `--nnodes`, `--node-rank`, "
    "`--master-addr` for several). It sets PYTHONPATH to this server's checkout: edit it, or "
    "run from an OctoPipe checkout."
)
st.code("\n".join(files), language=None)
c1, c2 = st.columns(2)
c1.download_button(
    "Download PyTorch schedule (CSV)",
    csv,
    file_name=f"{base}-schedule.csv",
    mime="text/csv",
    on_click="ignore",
    key="dl_csv",
)
c1.caption("For torch.distributed.pipelining's `_PipelineScheduleRuntime._load_csv`.")
c2.download_button(
    "Download Chrome trace (JSON)",
    trace,
    file_name=f"{base}-trace.json",
    mime="application/json",
    on_click="ignore",
    key="dl_trace",
)
c2.caption("Open in https://ui.perfetto.dev or chrome://tracing.")
