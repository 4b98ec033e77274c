"""Run every test at once, sized for a 2-core machine.

The multi-process tests (``-m dist``: gloo ranks, ``torchrun`` jobs) run in the foreground:
gloo ranks that share their cores with other busy processes wait for the scheduler at every
message (5-10x slower, measured). Everything else runs beside them at idle priority
(``SCHED_IDLE``, which only gets CPU time no foreground process wants): the in-process tests
(``-m "not dist and not e2e and not wheel"``, each a single busy thread) in shards that share
them out as they go (each takes the next test no other has claimed: ``tests/conftest.py``),
and the browser tests then the wheel test. Alone, the multi-process tests keep 1.3 of the 2
cores busy on average (process starts, one-rank phases, waits); the others take the rest. The
two phases this replaced ran them one after the other (488 -> 343 s, docs/benchmarks.md).

Each job's output streams live, prefixed with its name; the exit status is non-zero when any
job fails or selects no test. With arguments (``tests/test_plan.py -x``), one pytest runs
them instead.

``--fast`` runs only the in-process tests, in the same shards, in the foreground: the fast lane
for development (no multi-process, browser or wheel test).

Usage: ``python .ci/lanes.py [--fast | PYTEST_ARGS...]`` (``bash .ci/run`` passes its arguments
on).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Collection

PYTEST = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--timeout=600"]
IN_PROCESS = "not dist and not e2e and not wheel"
BESIDE = "(e2e or wheel) and not dist"  # browser and wheel tests, beside the shards
ALONE = "dist"  # in the foreground
SHARDS = 2  # each pytest process spends about 11 s collecting; two keep both cores busy


def _relay(name: str, proc: subprocess.Popen[str], last: dict[str, str]) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        line = line.rstrip("\n")
        if line.strip():
            last[name] = line
        print(f"[{name}] {line}", flush=True)


def _background() -> None:
    """Run this process (and its children) only on CPU time nobody else wants."""
    if hasattr(os, "SCHED_IDLE"):
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    else:
        os.nice(19)


def _foreground() -> None:
    """Run this process at the normal policy, even when the caller runs in the background."""
    if hasattr(os, "SCHED_IDLE"):  # Linux: the policies exist and can be set
        os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))


def run_together(
    jobs: dict[str, tuple[list[str], dict[str, str]]], background: Collection[str] = ()
) -> dict[str, int]:
    """Start every job at once (those named in ``background`` at idle priority), relay their
    output line by line, return their exit codes."""
    procs, threads, last = {}, [], {}
    # the suite starts many interpreters (pytest, CLI runs, launchers, servers) that import
    # this checkout's modules: let them write and reuse its compiled bytecode, whatever the
    # shell says (the whole run: 672-696 -> 558 busy core-s, measured on 2 cores)
    base = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    for name, (args, env) in jobs.items():
        proc = subprocess.Popen(
            [*PYTEST, *args],
            env={**base, **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            preexec_fn=_background if name in background else _foreground,
        )
        procs[name] = proc
        t = threading.Thread(target=_relay, args=(name, proc, last), daemon=True)
        t.start()
        threads.append(t)
    codes = {name: proc.wait() for name, proc in procs.items()}
    for t in threads:
        t.join()
    for name, code in codes.items():
        print(f"== {name}: exit {code}: {last.get(name, '(no output)')}", flush=True)
    return codes


def failed(codes: dict[str, int]) -> int:
    """0 when every job passed; else 1, after naming the jobs that did not."""
    bad = [name for name, code in codes.items() if code != 0]
    if bad:
        print(f"== FAILED: {', '.join(bad)}", file=sys.stderr)
    return 1 if bad else 0


def plan_jobs(
    claims: str, fast: bool = False
) -> tuple[dict[str, tuple[list[str], dict[str, str]]], set[str]]:
    """The jobs of a whole run and the names of those in the background. ``fast``: only the
    in-process tests, in ``SHARDS`` shards in the foreground (nothing else wants the cores)."""
    shards = {
        f"in-process {i + 1}/{SHARDS}": (
            ["-m", IN_PROCESS, "--durations=8"],
            {"OCTOPIPE_TEST_CLAIMS": claims},
        )
        for i in range(SHARDS)
    }
    if fast:
        return shards, set()
    background = {**shards, "browser, wheel": (["-m", BESIDE], {})}
    jobs = {"processes": (["-m", ALONE, "--durations=15"], {}), **background}
    return jobs, set(background)


def main(args: list[str]) -> int:
    fast = args == ["--fast"]
    if "--fast" in args and not fast:
        print(
            "lanes.py: --fast takes no other argument (pytest arguments run one pytest)",
            file=sys.stderr,
        )
        return 2
    if args and not fast:
        return subprocess.call([*PYTEST, "--durations=15", *args])
    t0 = time.monotonic()
    claims = tempfile.mkdtemp(prefix="octopipe-test-claims-")  # tests/conftest.py shares them
    jobs, background = plan_jobs(claims, fast)
    shards = f"in-process tests in {SHARDS} shards"
    others = "; multi-process tests in the foreground, browser and wheel tests at idle priority"
    print(f"== {shards}{'' if fast else others}", flush=True)
    try:
        codes = run_together(jobs, background=background)
    finally:
        shutil.rmtree(claims, ignore_errors=True)
    print(f"== tests: {time.monotonic() - t0:.0f} s")
    return failed(codes)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
