"""Run every test in two phases, sized for a 2-core machine.

Phase 1 runs the in-process tests (``-m "not dist and not e2e and not wheel"``, each a single
busy thread) in shards at once, and beside them the browser tests (mostly waiting on the page)
then the wheel test. Phase 2 runs the multi-process tests (gloo ranks, ``torchrun`` jobs)
alone: gloo ranks that share their cores with other busy processes wait for the scheduler at
every message (5-10x slower, measured), so they get the machine to themselves.

Each shard's output streams live, prefixed with its name; the exit status is non-zero when any
shard fails or selects no test. With arguments (``tests/test_plan.py -x``), one pytest runs
them instead.

Usage: ``python .ci/lanes.py [PYTEST_ARGS...]`` (``bash .ci/run`` passes its arguments on).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

PYTEST = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--timeout=600"]
IN_PROCESS = "not dist and not e2e and not wheel"
BESIDE = "(e2e or wheel) and not dist"  # browser and wheel tests, beside the shards
ALONE = "dist"  # phase 2
SHARDS = 3


def _relay(name: str, proc: subprocess.Popen[str], last: dict[str, str]) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        line = line.rstrip("\n")
        if line.strip():
            last[name] = line
        print(f"[{name}] {line}", flush=True)


def run_together(jobs: dict[str, tuple[list[str], dict[str, str]]]) -> dict[str, int]:
    """Start every job at once, relay their output line by line, return their exit codes."""
    procs, threads, last = {}, [], {}
    for name, (args, env) in jobs.items():
        proc = subprocess.Popen(
            [*PYTEST, *args],
            env={**os.environ, **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
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


def main(args: list[str]) -> int:
    if args:
        return subprocess.call([*PYTEST, "--durations=15", *args])
    t0 = time.monotonic()
    shards = {
        f"in-process {i + 1}/{SHARDS}": (
            ["-m", IN_PROCESS, "--durations=8"],
            {"OCTOPIPE_TEST_SHARD": f"{i}/{SHARDS}"},
        )
        for i in range(SHARDS)
    }
    shards["browser, wheel"] = (["-m", BESIDE], {})
    print(f"== phase 1: in-process tests in {SHARDS} shards, browser and wheel tests", flush=True)
    codes = run_together(shards)
    t1 = time.monotonic()
    print("== phase 2: multi-process tests, alone", flush=True)
    codes |= run_together({"processes": (["-m", ALONE, "--durations=15"], {})})
    t2 = time.monotonic()
    print(f"== tests: phase 1 {t1 - t0:.0f} s, phase 2 {t2 - t1:.0f} s, total {t2 - t0:.0f} s")
    return failed(codes)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
