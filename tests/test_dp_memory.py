"""The data-parallel buffers allocate no hidden copies of a stage's gradients: the float64
gradient norm works a chunk at a time (a whole float64 copy took 16 bytes a parameter, 29 GiB
of an H200 for 1.9 billion parameters), and moving the gradients into the flat float32 buffer
creates that buffer and nothing of its size besides."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils._pytree import tree_flatten  # noqa: E402

from octopipe_core.executor import dp  # noqa: E402
from octopipe_core.executor.dp import DataParallel, square_sum  # noqa: E402
from octopipe_core.executor.settings import OptimSettings  # noqa: E402


class NewStorages(TorchDispatchMode):
    """Records the bytes of every new storage an op's outputs live in (not views of its
    inputs), once per storage."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: dict[int, tuple[int, torch.dtype]] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        ins = {
            t.untyped_storage().data_ptr()
            for t in tree_flatten((args, kwargs))[0]
            if isinstance(t, torch.Tensor)
        }
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in ins:
                st = t.untyped_storage()
                self.seen.setdefault(st.data_ptr(), (st.nbytes(), t.dtype))
        return out


def test_the_float64_norm_needs_one_chunk_of_temporary(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dp, "_CHUNK_MIN", 100)
    monkeypatch.setattr(dp, "_CHUNK_MAX", 1000)
    g = torch.randn(10_500, dtype=torch.float32)
    with NewStorages() as rec:
        got = square_sum(g)
    assert got == pytest.approx(float((g.double() ** 2).sum()), rel=1e-12)
    wide = [n for n, dt in rec.seen.values() if dt == torch.float64]
    assert wide and max(wide) <= 8 * 1000  # never a float64 copy of the whole buffer
    with NewStorages() as rec:
        square_sum(g[:6400])  # 1/64 of a small buffer, down to the smallest chunk
    assert max(n for n, dt in rec.seen.values() if dt == torch.float64) <= 8 * 100


def test_moving_gradients_into_the_flat_buffer_copies_nothing_else() -> None:
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(n, dtype=torch.bfloat16)) for n in (300, 500, 200)]
    for p in params:
        p.grad = torch.randn_like(p)
    want = torch.cat([p.grad.float() for p in params if p.grad is not None])
    dpar = DataParallel(
        {0: [(f"w{i}", p) for i, p in enumerate(params)]}, 1, 0, None, False, OptimSettings()
    )
    with NewStorages() as rec:
        dpar.launch(0)
    buf = dpar.buffers[0]
    assert buf.grad is not None and torch.equal(buf.grad[:1000], want)
    assert all(p.grad is None for p in params)  # freed as they moved
    # the flat float32 buffer alone: no per-parameter float32 copies before it is filled
    assert sorted(n for n, _ in rec.seen.values()) == [buf.grad.untyped_storage().nbytes()]
