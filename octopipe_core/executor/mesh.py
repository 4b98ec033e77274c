"""The job's 2-D rank grid: pipeline devices (pp) x data-parallel replicas (dp).

The executor runs one process per (replica, pipeline device); TP is not executed (a layout's
``tp`` describes the profile's device, see ``octopipe_core.layout``). Global ranks follow the
layout's ``order`` with TP = 1: ``"tp-dp-pp"`` (Megatron's default, the replicas of one
pipeline device are neighbours) or ``"tp-pp-dp"`` (a pipeline's devices are neighbours), or an
explicit ``mapping`` (divided by ``tp``).

``JobLayout`` is pure Python (export, launch scripts, tests); ``build_mesh`` makes the torch
``DeviceMesh`` (dims ``("pp", "dp")``) with its process groups.

>>> lay = JobLayout(pp=2, dp=2)
>>> lay.world, lay.rank(replica=1, device=0), lay.coords(2)
(4, 1, (0, 1))
>>> JobLayout(pp=2, dp=2, order="tp-pp-dp").rank(replica=1, device=0)
2
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from octopipe_core.errors import OctoPipeError, input_error

ORDERS = ("tp-dp-pp", "tp-pp-dp")


@dataclass(frozen=True)
class JobLayout:
    """How many ranks a job has and which global rank runs (replica, pipeline device)."""

    pp: int
    dp: int = 1
    zero1: bool = False
    order: str = "tp-dp-pp"
    mapping: tuple[tuple[int, ...], ...] | None = None  # [replica][device] -> global rank

    @property
    def world(self) -> int:
        return self.pp * self.dp

    def rank(self, replica: int, device: int) -> int:
        """Global rank of pipeline ``device`` in ``replica``."""
        if self.mapping is not None:
            return self.mapping[replica][device]
        if self.order == "tp-dp-pp":
            return replica + self.dp * device
        return device + self.pp * replica

    def coords(self, rank: int) -> tuple[int, int]:
        """``(replica, device)`` of a global rank."""
        for r in range(self.dp):
            for d in range(self.pp):
                if self.rank(r, d) == rank:
                    return r, d
        raise OctoPipeError(
            f"rank {rank}: not in a {self.world}-rank job; fix: launch {self.world}"
        )

    def grid(self) -> list[list[int]]:
        """Global ranks as ``[device][replica]`` (the ``DeviceMesh`` tensor, dims pp x dp)."""
        return [[self.rank(r, d) for r in range(self.dp)] for d in range(self.pp)]

    def pipeline(self, replica: int) -> list[int]:
        """Global ranks of ``replica``'s pipeline devices, in device order."""
        return [self.rank(replica, d) for d in range(self.pp)]

    def label(self) -> str:
        return f"PP{self.pp} x DP{self.dp}{' zero1' if self.zero1 else ''}"

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if self.mapping is None:
            d.pop("mapping")
        else:
            d["mapping"] = [list(r) for r in self.mapping]
        return d

    @staticmethod
    def from_dict(data: Any, pp: int, src: str = "executor config") -> JobLayout:
        """Read a config's ``layout`` (``dp``, ``zero1``, ``order``, optional ``mapping`` and
        ``tp``); ``pp`` is the plan's device count."""
        if data is None:
            return JobLayout(pp=pp)
        if not isinstance(data, dict):
            raise input_error(src, "layout", "expected an object", 'write {"dp": 2}')
        if "pp" in data and data["pp"] != pp:
            raise input_error(
                src, "layout.pp", f"{data['pp']} but the plan has {pp} devices", f"set pp to {pp}"
            )
        dp = data.get("dp", 1)
        if isinstance(dp, bool) or not isinstance(dp, int) or dp < 1:
            raise input_error(src, "layout.dp", f"got {dp!r}", "use a positive integer")
        zero1 = data.get("zero1", False)
        if not isinstance(zero1, bool):
            raise input_error(src, "layout.zero1", f"got {zero1!r}", "use true or false")
        order = data.get("order", "tp-dp-pp")
        if order not in ORDERS:
            raise input_error(
                src, "layout.order", f"got {order!r}", f"use one of {', '.join(ORDERS)}"
            )
        mapping = None
        raw = data.get("mapping")
        if raw is not None:
            tp = int(data.get("tp", 1))
            try:
                mapping = tuple(tuple(int(g) // tp for g in row) for row in raw)
            except (TypeError, ValueError):
                raise input_error(
                    src, "layout.mapping", "expected [[gpu, ...], ...]", "give one row per replica"
                ) from None
            flat = sorted(g for row in mapping for g in row)
            if (
                len(mapping) != dp
                or any(len(r) != pp for r in mapping)
                or flat != list(range(pp * dp))
            ):
                raise input_error(
                    src,
                    "layout.mapping",
                    "does not map the job's ranks one to one",
                    f"give {dp} rows of {pp} distinct GPU indices that cover 0..{pp * dp - 1} "
                    "(times tp), or drop it to use 'order'",
                )
        return JobLayout(pp=pp, dp=dp, zero1=zero1, order=order, mapping=mapping)


def config_layout(cfg: dict[str, Any]) -> JobLayout:
    """The ``JobLayout`` of an executor config (one replica when it has no ``layout``)."""
    return JobLayout.from_dict(cfg.get("layout"), int(cfg["plan"]["num_devices"]))


@dataclass
class RankMesh:
    """This rank's place in the job: coordinates, its pipeline's ranks and the torch mesh."""

    layout: JobLayout
    rank: int
    replica: int
    device: int  # pipeline device index (the lowered plan's rank)
    pipeline: list[int]  # global rank of each pipeline device of this replica
    mesh: Any  # torch.distributed.device_mesh.DeviceMesh (None when world == 1)

    @property
    def dp_group(self) -> Any:
        """Process group of this device's replicas (None with one replica)."""
        return None if self.layout.dp == 1 else self.mesh.get_group("dp")

    @property
    def pp_group(self) -> Any:
        return None if self.layout.pp == 1 else self.mesh.get_group("pp")

    @property
    def dp_rank(self) -> int:
        return self.replica


def build_mesh(layout: JobLayout, device_type: str) -> RankMesh:
    """The ``DeviceMesh`` (pp x dp) on the initialised default process group."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh

    rank, world = dist.get_rank(), dist.get_world_size()
    if world != layout.world:
        raise OctoPipeError(
            f"executor: the plan needs {layout.label()} = {layout.world} ranks, the job has "
            f"{world}; fix: launch with --nproc-per-node x --nnodes = {layout.world}"
        )
    replica, device = layout.coords(rank)
    mesh = None
    if world > 1:
        mesh = DeviceMesh(
            device_type, torch.tensor(layout.grid(), dtype=torch.int64), mesh_dim_names=("pp", "dp")
        )
    return RankMesh(layout, rank, replica, device, layout.pipeline(replica), mesh)
