"""The Export page's training-job settings (AppTest, headless): model hook, data, steps,
optimizer, checkpoints, DP and ZeRO-1 reach the job folder; bad fields show one-line errors in
the page, never a traceback."""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

from streamlit.testing.v1 import AppTest

from app.components.exporting import JobSettings, job_zip
from octopipe_core.profile import load_sample
from octopipe_core.schedules import build_plan

APP = str(Path(__file__).resolve().parent.parent / "app" / "streamlit_app.py")


def export_page() -> AppTest:
    at = AppTest.from_file(APP, default_timeout=90)
    at.run()
    at.switch_page("views/export.py")
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_export_page_job_settings_reach_the_command_and_the_zip() -> None:
    at = export_page()
    assert "Download runnable job (zip)" in [b.label for b in at.download_button]
    at.text_input(key="job_model").set_value("mymodel.llama:build")
    at.selectbox(key="job_data").set_value("tokens").run()
    at.text_input(key="job_tokens").set_value("/data/train.bin")
    at.number_input(key="job_steps").set_value(250)
    at.number_input(key="job_lr").set_value(3e-4)
    at.number_input(key="job_wd").set_value(0.1)
    at.number_input(key="job_clip").set_value(0.5)
    at.number_input(key="job_ckpt").set_value(50)
    at.number_input(key="job_dp").set_value(2)
    at.checkbox(key="job_zero1").check().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    cmd = next(c.value for c in at.code if c.value.startswith("octopipe export"))
    for part in ("--model mymodel.llama:build", "--data /data/train.bin", "--steps 250",
                 "--lr 0.0003", "--weight-decay 0.1", "--clip 0.5", "--checkpoint-every 50",
                 "--dp 2 --zero1"):  # fmt: skip
        assert part in cmd, (part, cmd)
    assert any("DP2 with ZeRO-1" in c.value and "ranks" in c.value for c in at.caption)
    assert "Download runnable job (zip)" in [b.label for b in at.download_button]
    files = next(c.value for c in at.code if "launch.sh" in c.value)
    assert "slurm.sbatch" in files
    # a data hook instead of the token file
    at.selectbox(key="job_data").set_value("hook").run()
    at.text_input(key="job_data_hook").set_value("mydata:batch").run()
    assert not at.error
    assert "--data-hook mydata:batch" in next(
        c.value for c in at.code if "octopipe export" in c.value
    )


def test_export_page_reports_bad_settings_in_the_page() -> None:
    at = export_page()
    at.text_input(key="job_model").set_value("not a hook").run()
    assert not at.exception
    assert any("model hook 'not a hook': expected module:function" in e.value for e in at.error)
    assert "Download runnable job (zip)" not in [b.label for b in at.download_button]
    assert "Download plan (JSON, profile embedded)" in [b.label for b in at.download_button]
    at.text_input(key="job_model").set_value("")
    at.checkbox(key="job_zero1").check().run()
    assert any("ZeRO-1 with DP 1" in e.value for e in at.error)
    at.checkbox(key="job_zero1").uncheck()
    at.selectbox(key="job_data").set_value("tokens").run()
    assert any("token file: empty" in e.value for e in at.error)


def test_job_settings_write_the_job_config() -> None:
    prof = load_sample("tiny-hybrid")
    s = JobSettings(model_hook="", data="tokens", token_path="train.bin", steps=40, lr=2e-3,
                    weight_decay=0.05, clip=0.7, checkpoint_every=10, dp=2, zero1=True)  # fmt: skip
    data, names = job_zip(build_plan(prof, "zbv", 2, 4), prof, "job", s)
    assert "job/slurm.sbatch" in names and "job/launch.sh" in names
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        cfg = json.loads(zf.read("job/executor_config.json"))
        assert zf.getinfo("job/launch.sh").external_attr >> 16 & 0o111
    assert cfg["layout"] == {"pp": 2, "dp": 2, "zero1": True, "order": "tp-dp-pp"}
    assert cfg["data"] == {"kind": "tokens", "path": "train.bin", "token_dtype": "uint16",
                           "hook": ""}  # fmt: skip
    assert cfg["train"]["lr"] == 2e-3 and cfg["train"]["clip"] == 0.7
    assert cfg["train"]["weight_decay"] == 0.05 and cfg["runtime"]["steps"] == 40
    assert cfg["checkpoint"]["every"] == 10 and cfg["model"]["factory"] == ""
