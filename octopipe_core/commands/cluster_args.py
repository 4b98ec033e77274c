"""Command-line options that put a plan on a cluster (``--cluster``, ``--dp``, ...)."""

from __future__ import annotations

import argparse

from octopipe_core.cluster import list_cluster_samples, resolve_cluster
from octopipe_core.commands.argtypes import COUNT, float_in
from octopipe_core.errors import OctoPipeError
from octopipe_core.layout import ORDERS, deploy
from octopipe_core.profile import Profile


def add_cluster_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group(
        "cluster (optional: without --cluster, one pipeline on a flat network)"
    )
    g.add_argument(
        "--cluster",
        metavar="C",
        default=None,
        help=f"cluster .json or bundled sample ({', '.join(list_cluster_samples())})",
    )
    g.add_argument("--dp", type=COUNT, default=1, metavar="N", help="data-parallel replicas")
    g.add_argument(
        "--tp",
        type=COUNT,
        default=None,
        metavar="N",
        help="tensor-parallel degree; must equal the profile's device.gpus (checked)",
    )
    g.add_argument("--zero1", action="store_true", help="shard optimizer state over DP (ZeRO-1)")
    g.add_argument(
        "--order", choices=ORDERS, default="tp-dp-pp", help="rank order (Megatron's first)"
    )
    g.add_argument(
        "--bucket-mib", type=float_in(0, 1e6), default=0.0, metavar="X",
        help="gradient bucket size in MiB (default 0: one bucket per stage)",
    )  # fmt: skip
    g.add_argument(
        "--no-overlap-grad-reduce", action="store_true",
        help="start every gradient reduction after the device's last compute op",
    )  # fmt: skip


def apply_cluster(prof: Profile, args: argparse.Namespace, devices: int) -> Profile:
    """``prof`` deployed on ``--cluster`` with the layout flags, or unchanged without it."""
    if args.cluster is None:
        if args.dp != 1 or args.zero1 or args.tp is not None:
            raise OctoPipeError(
                "field '--dp/--tp/--zero1': given without --cluster; "
                "fix: add --cluster NAME (e.g. 16x8-h800-ib400)"
            )
        return prof
    if args.dp < 1:
        raise OctoPipeError(f"field '--dp': got {args.dp}; fix: use 1 or more replicas")
    if not args.bucket_mib >= 0:
        raise OctoPipeError(f"field '--bucket-mib': got {args.bucket_mib}; fix: use a number >= 0")
    cluster = resolve_cluster(args.cluster)
    return deploy(
        prof, cluster, devices, args.dp,
        tp=prof.device.gpus if args.tp is None else args.tp,
        zero1=args.zero1, order=args.order, bucket_mib=args.bucket_mib,
        overlap_grad_reduce=not args.no_overlap_grad_reduce,
    )  # fmt: skip
