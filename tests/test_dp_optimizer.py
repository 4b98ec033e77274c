"""The executor's optimizer works on the stages' flat buffers without ``torch.optim`` and
gives exactly what ``torch.optim`` gives on the same tensors; a rank that steps it never
imports ``torch._dynamo`` (2 s of CPU per fresh rank, as long as ``import torch``)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

from octopipe_core.executor.dp import DataParallel  # noqa: E402
from octopipe_core.executor.settings import OptimSettings  # noqa: E402


def _stages(dtype: torch.dtype) -> dict[int, list[tuple[str, torch.nn.Parameter]]]:
    g = torch.Generator().manual_seed(0)
    mk = lambda *shape: torch.nn.Parameter(torch.randn(*shape, generator=g).to(dtype))  # noqa: E731
    return {0: [("a", mk(5, 3)), ("b", mk(7))], 2: [("c", mk(4, 4))]}


@pytest.mark.parametrize("optimizer", ["adamw", "sgd"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_flat_step_equals_torch_optim_on_the_same_tensors(
    optimizer: str, dtype: torch.dtype
) -> None:
    settings = OptimSettings(optimizer=optimizer, lr=0.01, weight_decay=0.1)
    stages = _stages(dtype)
    dpar = DataParallel(stages, 1, 0, None, False, settings)
    # torch's optimizer on copies of the flat master buffers, fed the same gradients
    masters = [b.master.detach().clone() for b in dpar.buffers.values()]
    if optimizer == "sgd":
        ref: torch.optim.Optimizer = torch.optim.SGD(masters, lr=0.01, weight_decay=0.1)
    else:
        ref = torch.optim.AdamW(
            masters,
            lr=0.01,
            betas=(settings.beta1, settings.beta2),
            eps=settings.eps,
            weight_decay=0.1,
            fused=True,
        )
    g = torch.Generator().manual_seed(1)
    try:
        for k in range(3):
            lr = 0.01 * (k + 1)  # the schedule's learning rate changes every step
            for b in dpar.buffers.values():
                b.flat.copy_(torch.randn(b.flat.shape, generator=g, dtype=b.flat.dtype))
            for m, b in zip(masters, dpar.buffers.values(), strict=True):
                m.grad = b.flat.clone() * 0.5
            for group in ref.param_groups:
                group["lr"] = lr
            ref.step()
            dpar.wait()
            dpar.step(lr, clip_coef=0.5)
            for m, b in zip(masters, dpar.buffers.values(), strict=True):
                assert torch.equal(m, b.master), (optimizer, dtype, k)
                if optimizer == "adamw":
                    st = ref.state[m]
                    assert torch.equal(st["exp_avg"], b.state["exp_avg"])
                    assert torch.equal(st["exp_avg_sq"], b.state["exp_avg_sq"])
                    assert float(b.state["step"]) == k + 1
                else:
                    assert b.state == {}
        # the parameters are the master copies in their own dtype; the gradients are cleared
        for b in dpar.buffers.values():
            off = 0
            for p in b.params:
                want = b.master[off : off + p.numel()].view_as(p).to(dtype)
                assert torch.equal(p.detach(), want)
                off += p.numel()
            assert not b.flat.any()
    finally:
        dpar.release()


def test_checkpoint_keys_name_each_stage_state() -> None:
    dpar = DataParallel(_stages(torch.float32), 1, 0, None, False, OptimSettings())
    try:
        keys = sorted(dpar.state_tensors())
    finally:
        dpar.release()
    assert keys == [
        "master.s0",
        "master.s2",
        "optim.s0.exp_avg",
        "optim.s0.exp_avg_sq",
        "optim.s0.step",
        "optim.s2.exp_avg",
        "optim.s2.exp_avg_sq",
        "optim.s2.step",
    ]


@pytest.mark.timeout(120)
def test_an_optimizer_step_does_not_import_dynamo() -> None:
    code = textwrap.dedent(
        """
        import sys
        import torch
        from octopipe_core.executor.dp import DataParallel
        from octopipe_core.executor.settings import OptimSettings
        for opt in ("adamw", "sgd"):
            p = torch.nn.Parameter(torch.ones(3))
            d = DataParallel({0: [("p", p)]}, 1, 0, None, False, OptimSettings(optimizer=opt))
            (p * 2.0).sum().backward()
            d.wait()
            d.step(0.1)
            assert float(p[0]) < 1.0, opt
        print("torch._dynamo" in sys.modules)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=110, check=True
    )
    assert out.stdout.strip() == "False", out.stdout + out.stderr
