"""A built wheel installs anywhere: sample profiles ship as package data (issue 11).

Builds the wheel from a copy of this checkout (plus a probe file in a nested sample subfolder),
installs it with ``--no-deps`` into a fresh virtual environment that sees this interpreter's
packages (torch is not downloaded again), and runs the README's commands from another folder
with no ``PYTHONPATH``. ``octopipe run --check`` and ``octopipe profile`` are left to the
executor tests (tens of seconds each here).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
IGNORE = shutil.ignore_patterns(
    ".git", "build", "dist", "*.egg-info", "__pycache__", ".venv", ".pytest_cache", "node_modules"
)
PROBE = Path("probe_sub") / "deeper" / "probe.json"  # any subfolder ships, like clusters/


def _run(cmd: list[str], cwd: Path, env: dict[str, str] | None = None) -> str:
    r = subprocess.run(
        cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert r.returncode == 0, f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}"
    return r.stdout


def _pip_version() -> tuple[int, ...]:
    import pip

    return tuple(int(x) for x in pip.__version__.split(".")[:2] if x.isdigit())


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with the wheel installed; returns its folder."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    shutil.copytree(ROOT, src, ignore=IGNORE)
    (src / "sample_profiles" / PROBE).parent.mkdir(parents=True)
    (src / "sample_profiles" / PROBE).write_text('{"probe": true}\n')
    dist = tmp / "dist"
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
          "-w", str(dist), str(src)], tmp)  # fmt: skip
    (wheel,) = dist.glob("octopipe-*.whl")
    env_dir = tmp / "venv"
    py = str(env_dir / "bin" / "python")
    if _pip_version() >= (22, 3):  # this pip installs into the venv: no pip copy needed there
        _run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip",
              str(env_dir)], tmp)  # fmt: skip
        _run([sys.executable, "-m", "pip", "--python", py, "install", "-q", "--no-deps",
              str(wheel)], tmp)  # fmt: skip
    else:
        _run([sys.executable, "-m", "venv", "--system-site-packages", str(env_dir)], tmp)
        _run([py, "-m", "pip", "install", "-q", "--no-deps", str(wheel)], tmp)
    return env_dir


@pytest.fixture
def clean_env() -> dict[str, str]:
    """No PYTHONPATH: only the venv's (wheel's) octopipe_core can be imported."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


@pytest.mark.wheel
def test_wheel_ships_every_sample_file(venv: Path, tmp_path: Path, clean_env: dict) -> None:
    code = (
        "import json, octopipe_core, octopipe_core.profile as p; "
        "d = p.sample_profiles_dir(); "
        "print(json.dumps([octopipe_core.__file__, str(d), p.list_samples()]))"
    )
    out = _run([str(venv / "bin" / "python"), "-c", code], tmp_path, clean_env)
    pkg_file, sample_dir, samples = json.loads(out)
    assert Path(pkg_file).is_relative_to(venv)  # the wheel's copy, not the checkout's
    assert Path(sample_dir) == Path(pkg_file).parent / "sample_profiles"
    shipped = Path(sample_dir)
    for f in (ROOT / "sample_profiles").rglob("*"):
        if f.is_file():
            rel = f.relative_to(ROOT / "sample_profiles")
            assert (shipped / rel).read_bytes() == f.read_bytes(), rel
    assert (shipped / PROBE).is_file() and (shipped / "README.md").is_file()
    assert set(samples) >= {"llama-3-8b", "nemotron-h-8b", "nemotron-h-56b", "tiny-hybrid"}


@pytest.mark.wheel
def test_readme_commands_outside_the_checkout(venv: Path, tmp_path: Path, clean_env: dict) -> None:
    octo = str(venv / "bin" / "octopipe")

    def run(*args: str) -> str:
        return _run([octo, *args], tmp_path, clean_env)

    text = run("baselines", "--profile", "nemotron-h-8b", "--devices", "8", "--microbatches", "32")
    assert "zb-h2/balanced" in text and "dualpipev/balanced" in text
    m = json.loads(run("simulate", "--profile", "nemotron-h-8b", "--schedule", "zbv", "--devices",
                       "8", "--microbatches", "32", "--partition", "balanced", "--memory-gib",
                       "80", "--json"))  # fmt: skip
    assert m["schedule"] == "zbv/balanced" and m["devices"] == 8
    text = run("simulate", "--profile", "tiny-hybrid", "--schedule", "zb-h1", "--devices", "2",
               "--microbatches", "4", "--show-schedule", "--out", "plan.json")  # fmt: skip
    assert "d1: " in text and (tmp_path / "plan.json").is_file()
    again = json.loads(run("simulate", "--plan", "plan.json", "--json"))
    assert again["schedule"] == "zb-h1/uniform"
    run("tune", "--profile", "nemotron-h-8b", "--devices", "8", "--microbatches", "32",
        "--memory-gib", "80", "--time-budget-s", "1", "--out", "tuned.json")  # fmt: skip
    assert json.loads((tmp_path / "tuned.json").read_text())["profile"]["name"] == "nemotron-h-8b"
    run("export", "plan.json", "--out", "job/")
    assert (tmp_path / "job" / "launch.sh").is_file()
    py = str(venv / "bin" / "python")
    _run([py, "-m", "octopipe_core.costmodel", "--preset", "nemotron-h-56b", "--out", "x.csv"],
         tmp_path, clean_env)  # fmt: skip
    assert "# gpus: 8" in (tmp_path / "x.csv").read_text()
    assert "usage" in _run(
        [py, "-m", "octopipe_core.executor.worker", "--help"], tmp_path, clean_env
    )


def test_packaged_list_matches_the_packages_on_disk() -> None:
    """pyproject.toml lists packages by hand (for the sample mapping); none may be missing."""
    tomllib = pytest.importorskip("tomllib")
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    on_disk = {
        ".".join(p.parent.relative_to(ROOT).parts)
        for p in (ROOT / "octopipe_core").rglob("__init__.py")
    }
    listed = set(cfg["packages"])
    assert on_disk == listed - {"octopipe_core.sample_profiles"}
    assert cfg["package-dir"] == {"octopipe_core.sample_profiles": "sample_profiles"}
