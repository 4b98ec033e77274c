"""Start every rank of a job on this machine, for ``octopipe run``: one launcher process, one
child per rank, torchrun's environment (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ...).

With gloo (CPU), the launcher imports torch and the parts of it a rank loads lazily once,
then forks the ranks, which start with all of it loaded: a 4-rank job takes about half of
torchrun's wall time and a third of its CPU (``benchmarks/bench_launch.py``). With NCCL (or
``auto``), each child execs a fresh interpreter, as torchrun does: a CUDA context must not be
shared across a fork.

The rendezvous store is the launcher's (``TORCHELASTIC_USE_AGENT_STORE``, as under
torchrun), created after the fork on a port the kernel picks, and each child reads the port
from a pipe: the store's server thread does not exist yet at the fork, and no port is
guessed. When a rank fails, the others get SIGTERM, then SIGKILL after ``--grace-s``; each
failed rank is named on stderr (``octopipe launch: rank 1 exited with code -9 (SIGKILL)``)
and the exit status is 1.
SIGTERM, SIGINT and SIGHUP to the launcher end every rank; SIGUSR1 is passed on to them (a
checkpoint request).

Usage: ``python -m octopipe_core.executor.local_launch --nproc N [--exec] -- CONFIG ARGS...``
(``ARGS`` are the worker's: ``--out``, ``--steps``, ``--backend``, ...).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import signal
import sys
import time
from pathlib import Path
from types import FrameType

WORKER = "octopipe_core.executor.worker"
# The worker, and what a rank imports lazily after it, loaded once before forking.
PRELOAD = (WORKER, "torch.profiler")
# 1.5 s of CPU to import: loaded first only for a job that will save or load a checkpoint
# (a rank asked for one by a signal imports it then)
CHECKPOINT_MODULE = "torch.distributed.checkpoint"


def rank_env(rank: int, world: int, port: int) -> dict[str, str]:
    """torchrun's environment for ``rank`` of ``world`` on one node, store on ``port``.

    >>> rank_env(1, 4, 29500)["LOCAL_RANK"], rank_env(1, 4, 29500)["WORLD_SIZE"]
    ('1', '4')
    """
    r, w = str(rank), str(world)
    return {
        "RANK": r,
        "LOCAL_RANK": r,
        "GROUP_RANK": "0",
        "ROLE_RANK": r,
        "WORLD_SIZE": w,
        "LOCAL_WORLD_SIZE": w,
        "ROLE_WORLD_SIZE": w,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "TORCHELASTIC_USE_AGENT_STORE": "True",
    }


def exit_text(code: int) -> str:
    """How a child ended, as ``code -9 (SIGKILL)`` or ``code 3``.

    >>> exit_text(-9), exit_text(3)
    ('code -9 (SIGKILL)', 'code 3')
    """
    name = ""
    if code < 0:
        with contextlib.suppress(ValueError):
            name = f" ({signal.Signals(-code).name})"
    return f"code {code}{name}"


def _child(rank: int, world: int, port_r: int, worker_args: list[str], fresh: bool) -> None:
    """In the forked child: wait for the store's port, then run (or exec) the worker."""
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1):
        signal.signal(sig, signal.SIG_DFL)
    code = 1
    try:
        with os.fdopen(port_r) as f:
            text = f.read().strip()
        if not text:  # the launcher failed before it had a store
            os._exit(1)
        os.environ.update(rank_env(rank, world, int(text)))
        if fresh:
            py = sys.executable
            os.execv(py, [py, "-m", WORKER, *worker_args])
        from octopipe_core.executor import worker

        code = worker.main(worker_args)  # ends the process itself after a run
    except SystemExit as e:  # argparse
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:  # report, then leave without the launcher's teardown
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


class _Ranks:
    """The children, by pid: reaps them, stops them all, passes signals on."""

    def __init__(self, grace_s: float) -> None:
        self.pids: dict[int, int] = {}
        self.grace_s = grace_s
        self.deadline: float | None = None  # set once the ranks are being stopped
        self.stopped_by = ""
        self.sent: set[int] = set()  # the signals this launcher sent to every rank

    def signal_all(self, sig: int) -> None:
        if sig != signal.SIGUSR1:
            self.sent.add(sig)
        for pid in self.pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    def stop(self) -> None:
        """SIGTERM to every rank left, SIGKILL after the grace period."""
        if self.deadline is None:
            self.deadline = time.monotonic() + self.grace_s
            self.signal_all(signal.SIGTERM)

    def on_signal(self, signum: int, _frame: FrameType | None) -> None:
        if signum == signal.SIGUSR1:
            self.signal_all(signum)
        else:
            self.stopped_by = signal.Signals(signum).name
            self.stop()

    def wait(self) -> int:
        """Reap every child; stop the others at the first failure. 0 when all ended with 0."""
        failed: list[str] = []
        while self.pids:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                if self.deadline is not None and time.monotonic() > self.deadline:
                    self.signal_all(signal.SIGKILL)
                time.sleep(0.02)
                continue
            rank = self.pids.pop(pid, None)
            if rank is None:
                continue
            code = os.waitstatus_to_exitcode(status)
            # a rank this launcher stopped did not fail on its own
            if code != 0 and -code not in self.sent:
                failed.append(f"rank {rank} exited with {exit_text(code)}")
            if code != 0:
                self.stop()
        if self.stopped_by:
            failed.append(f"stopped by {self.stopped_by}: every rank ended")
        for line in failed:
            print(f"octopipe launch: {line}", file=sys.stderr, flush=True)
        return 1 if failed else 0


def preload_modules(worker_args: list[str]) -> list[str]:
    """The modules to import before forking the ranks of the worker on ``worker_args``
    (``CONFIG [--no-resume] ...``): ``PRELOAD``, and the checkpoint module when the job saves
    checkpoints as it goes (``checkpoint.every > 0``) or resumes from one. Not when the config
    cannot be read: the worker stops and says why (and any rank imports what it uses anyway).

    >>> preload_modules(["/no/such/executor_config.json"])
    ['octopipe_core.executor.worker', 'torch.profiler']
    """
    import json

    from octopipe_core.errors import OctoPipeError
    from octopipe_core.executor.settings import CheckpointSettings

    mods = list(PRELOAD)
    try:
        config = Path(worker_args[0])
        ck = CheckpointSettings.from_dict(json.loads(config.read_text()).get("checkpoint"))
        resume = ck.resume and "--no-resume" not in worker_args
        every = ck.every
        found = resume and (ck.path(config.resolve().parent) / "latest").is_file()
    except (OSError, ValueError, TypeError, AttributeError, IndexError, OctoPipeError):
        every, found = 0, False
    if every > 0 or found:
        mods.append(CHECKPOINT_MODULE)
    return mods


def launch(world: int, worker_args: list[str], fresh: bool, grace_s: float = 5.0) -> int:
    """Run ``world`` ranks of the worker on ``worker_args``; the exit status (0: all passed)."""
    if not fresh:
        for name in preload_modules(worker_args):
            importlib.import_module(name)
    ranks = _Ranks(grace_s)
    writers: list[int] = []
    sys.stdout.flush()
    sys.stderr.flush()
    # before the first fork: a signal between two forks still ends the ranks started so far
    # (each child puts the default handlers back)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1):
        signal.signal(sig, ranks.on_signal)
    for rank in range(world):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(w)
            for fd in writers:
                os.close(fd)
            _child(rank, world, r, worker_args, fresh)
        os.close(r)
        writers.append(w)
        ranks.pids[pid] = rank
    try:
        from datetime import timedelta

        from torch.distributed import TCPStore

        # lives until the ranks are reaped below (a local of this call)
        store = TCPStore(
            "127.0.0.1", 0, world, is_master=True, timeout=timedelta(seconds=60),
            wait_for_workers=False,
        )  # fmt: skip
        port = str(store.port)
    except Exception as e:  # every child must hear (an empty port: it exits with 1)
        print(f"octopipe launch: error: no rendezvous store: {e}", file=sys.stderr, flush=True)
        port = ""
    for w in writers:
        os.write(w, port.encode())
        os.close(w)
    return ranks.wait()


DIE_WITH_PARENT_ENV = "OCTOPIPE_DIE_WITH_PARENT"  # set by `octopipe run` for its launcher


def die_with_parent() -> None:
    """Have the kernel send this process SIGTERM when the one that started it dies, however
    it dies (Linux ``PR_SET_PDEATHSIG``; elsewhere nothing): the launcher then ends its ranks.
    If that parent is gone already, SIGTERM now."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    parent = os.getppid()
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGTERM)


def main(argv: list[str] | None = None) -> int:
    if os.environ.get(DIE_WITH_PARENT_ENV) == "1":
        die_with_parent()
    ap = argparse.ArgumentParser(prog="octopipe-launch", description=__doc__.splitlines()[0])
    ap.add_argument("--nproc", type=int, required=True, help="ranks to start (>= 1)")
    ap.add_argument("--exec", action="store_true", help="a fresh interpreter per rank")
    ap.add_argument("--grace-s", type=float, default=5.0, help="SIGTERM to SIGKILL (s)")
    ap.add_argument("worker_args", nargs=argparse.REMAINDER, help="-- CONFIG [worker args]")
    args = ap.parse_args(argv)
    rest = args.worker_args[1:] if args.worker_args[:1] == ["--"] else args.worker_args
    if args.nproc < 1 or not rest:
        ap.error("needs --nproc >= 1 and the worker's arguments after --")
    return launch(args.nproc, rest, args.exec, args.grace_s)


if __name__ == "__main__":
    raise SystemExit(main())
