"""Export page: the runnable training job (zip: torchrun + SLURM scripts), with its model hook,
data, steps, optimizer, checkpoints and DP settings; PyTorch's schedule CSV, a Chrome trace,
the plan JSON."""

from __future__ import annotations

import hashlib
import json

import streamlit as st

from app.components import analysis, exporting, state
from octopipe_core.errors import OctoPipeError
from octopipe_core.profile import Profile


@st.cache_data(show_spinner=False, max_entries=16)
def _job(
    _prof: Profile, prof_key: str, plan_js: str, folder: str, settings_js: str
) -> tuple[bytes, list[str]]:
    settings = exporting.JobSettings(**json.loads(settings_js))
    return exporting.job_zip(analysis.plan_from_json(plan_js), _prof, folder, settings)


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
st.subheader("Training job")
dep = plan.deployment
c1, c2, c3 = st.columns(3)
model_hook = c1.text_input(
    "model hook (module:function)",
    key="job_model",
    placeholder="stand-in layers",
    help="Your model: a function that builds this rank's layers (see the README's model hook). "
    "Empty: stand-in layers at CPU sizes. It is imported where the job runs, not here.",
)
data = c2.selectbox(
    "data",
    list(exporting.DATA_KINDS),
    format_func=lambda k: exporting.DATA_KINDS[k],
    key="job_data",
)
token_path, token_dtype, data_hook = "", "uint16", ""
if data == "tokens":
    token_path = c2.text_input(
        "token file (path where the job runs; relative = job folder)", key="job_tokens"
    )
    token_dtype = c2.selectbox("token id type", ["uint16", "uint32"], key="job_token_dtype")
elif data == "hook":
    data_hook = c2.text_input("data hook (module:function)", key="job_data_hook")
steps = c3.number_input("steps", min_value=1, max_value=10_000_000, value=100, key="job_steps")
o1, o2, o3 = st.columns(3)
lr = o1.number_input(
    "learning rate (AdamW, cosine)", min_value=0.0, value=1e-3, format="%.2e", key="job_lr"
)
wd = o2.number_input("weight decay", min_value=0.0, value=0.01, format="%.3f", key="job_wd")
clip = o3.number_input("gradient clip (max norm; 0: off)", min_value=0.0, value=1.0, key="job_clip")
d1, d2, d3 = st.columns(3)
ckpt_every = d3.number_input(
    "checkpoint every N steps (0: on request only)",
    min_value=0,
    max_value=10_000_000,
    value=0,
    key="job_ckpt",
)
dp = d1.number_input(
    "DP degree (pipeline replicas)",
    min_value=1,
    max_value=4096,
    value=dep.layout.dp if dep is not None else 1,
    key="job_dp",
)
zero1 = d2.checkbox(
    "ZeRO-1 (optimizer state sharded over DP)",
    value=bool(dep is not None and dep.layout.zero1),
    key="job_zero1",
)
settings = exporting.JobSettings(
    model_hook=model_hook.strip(),
    data=data or "synthetic",
    token_path=token_path,
    token_dtype=token_dtype,
    data_hook=data_hook.strip(),
    steps=int(steps),
    lr=float(lr),
    weight_decay=float(wd),
    clip=float(clip),
    checkpoint_every=int(ckpt_every),
    dp=int(dp),
    zero1=zero1,
)
bad = settings.errors()
for msg in bad:
    st.error(msg)
if bad:
    st.stop()
st.caption(
    f"PP{plan.num_devices} x DP{settings.dp}{' with ZeRO-1' if settings.zero1 else ''} = "
    f"{plan.num_devices * settings.dp} ranks (one per pipeline device and replica; TP is not "
    "executed). The same job from the command line:"
)
st.code(settings.cli(f"{base}.json"), language="bash", wrap_lines=True)
try:
    with st.spinner("writing the job"):
        prof_key = hashlib.sha1(
            json.dumps(prof.to_dict(), sort_keys=True).encode(), usedforsecurity=False
        ).hexdigest()
        data_zip, files = _job(prof, prof_key, js, base, json.dumps(settings.to_dict()))
    csv = exporting.torch_schedule_csv(plan)
    trace = exporting.chrome_trace(prof, plan)
except OctoPipeError as e:
    st.error(str(e))
    st.stop()
except Exception as e:  # the exporter is separate code: report, never a traceback
    st.error(f"Export failed: {type(e).__name__}: {e}")
    st.stop()
st.download_button(
    "Download runnable job (zip)",
    data_zip,
    file_name=f"{base}.zip",
    mime="application/zip",
    on_click="ignore",
    type="primary",
    key="dl_zip",
)
st.caption(
    "Unzip where the `octopipe` package is installed and run `./launch.sh` (torchrun, single "
    "node; `--nnodes`, `--node-rank`, `--master-addr` for several), `sbatch slurm.sbatch` on "
    "SLURM, or `octopipe run DIR --check` for a local gloo check. A `STOP` file in the job "
    "folder checkpoints and stops; a rerun resumes."
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
