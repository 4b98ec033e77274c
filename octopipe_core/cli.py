"""The ``octopipe`` command line (also ``python -m octopipe_core``).

Each sub-command lives in ``octopipe_core/commands/<name>.py`` and exposes
``register(subparsers)``, which adds its parser and sets ``func`` to a handler returning an
exit code. User errors (``OctoPipeError``) print as one line on stderr, exit code 2. When the
reader of stdout goes away (``octopipe baselines ... | head``), the command stops quietly with
exit code 141 (128 + SIGPIPE, as a shell tool killed by the signal would), no traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from octopipe_core.commands.argtypes import OneLineParser
from octopipe_core.errors import OctoPipeError

COMMAND_MODULES = (
    "simulate", "baselines", "export", "run", "profile", "tune", "plan-cluster", "verify",
    "calibrate",
)  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="octopipe",
        description="Simulate, compare, tune and export pipeline-parallel plans.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineParser)
    sub.required = True
    for name in COMMAND_MODULES:
        importlib.import_module(f"octopipe_core.commands.{name.replace('-', '_')}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        try:
            return _dispatch(argv)
        finally:
            sys.stdout.flush()  # a closed pipe shows up here, not at interpreter exit
    except BrokenPipeError:
        # Nothing more can reach the reader; point stdout at /dev/null so that the flush at
        # exit does not print "Exception ignored ... BrokenPipeError" either.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return 141


def _dispatch(argv: list[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except OctoPipeError as e:
        print(f"octopipe: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        raise  # handled in main(): the reader went away
    except OSError as e:  # a file vanished or a disk filled up mid-command
        print(f"octopipe: error: {e.filename or ''}: {e.strerror or e}; fix: check the path "
              "and free space", file=sys.stderr)  # fmt: skip
        return 2
    except KeyboardInterrupt:
        print("octopipe: interrupted", file=sys.stderr)
        return 130
    except Exception as e:
        from octopipe_core.commands.run import Stopped

        if not isinstance(e, Stopped):
            raise
        print(f"octopipe: stopped by {e}; every process it started has ended", file=sys.stderr)
        return 128 + e.signum


if __name__ == "__main__":
    raise SystemExit(main())
