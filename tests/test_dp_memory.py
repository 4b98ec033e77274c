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


def test_gradients_accumulate_into_the_flat_float32_buffer() -> None:
    """Autograd's accumulation (a hook moves each .grad at once) and the deferred W (added to
    ``main_grad`` directly) both end in the flat buffer, summed in float32 over micro-batches;
    no parameter keeps a .grad and no buffer the size of all the gradients is made."""
    from octopipe_core.executor.models import (
        DLinear,
        apply_weight_grads,
        defer_weight_grads,
    )

    def model() -> torch.nn.Module:
        torch.manual_seed(0)
        m = torch.nn.Sequential(DLinear(64, 64), torch.nn.LayerNorm(64), DLinear(64, 8))
        return m.to(torch.bfloat16)

    xs = [torch.randn(16, 64, dtype=torch.bfloat16, generator=torch.Generator().manual_seed(i))
          for i in range(3)]  # fmt: skip
    ref = model()
    want: dict[str, torch.Tensor] = {}
    for x in xs:
        ref.zero_grad(set_to_none=True)
        ref(x).float().pow(2).mean().backward()
        for n, p in ref.named_parameters():
            assert p.grad is not None
            want[n] = want.get(n, torch.zeros(p.shape)) + p.grad.float()
    ours = model()
    dpar = DataParallel({0: list(ours.named_parameters())}, 1, 0, None, False, OptimSettings())
    with NewStorages() as rec:
        ours(xs[0]).float().pow(2).mean().backward()  # autograd's accumulation
        store: list[Any] = []
        for x in xs[1:]:  # split backward, then the deferred weight gradients
            with defer_weight_grads(store):
                ours(x).float().pow(2).mean().backward()
            apply_weight_grads(store)
        dpar.launch(0)
    buf = dpar.buffers[0]
    assert buf.grad is not None and buf.grad.dtype == torch.float32
    assert all(p.grad is None for p in ours.parameters())
    got = dict(zip([n for n, _ in ours.named_parameters()], [
        buf.grad[o : o + p.numel()].view_as(p) for o, p in zip(
            [0, *torch.tensor([q.numel() for q in ours.parameters()]).cumsum(0).tolist()[:-1]],
            ours.parameters(), strict=True)], strict=True))  # fmt: skip
    for n, g in want.items():
        assert torch.allclose(got[n], g, rtol=2e-2, atol=1e-3), n
    # one parameter's gradient at a time, never a buffer of all of them (the flat one exists)
    assert max(n for n, _ in rec.seen.values()) < buf.grad.untyped_storage().nbytes()
    dpar.release()
    assert not any(hasattr(p, "main_grad") for p in ours.parameters())
