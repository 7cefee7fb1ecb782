"""The loss check's runs switch off the randomness drawn per micro-batch, so that two
splits of one global batch train on the same computation."""

from __future__ import annotations

import torch

from autotune.probe._loss_run import switch_off_dropout
from autotune.workloads import get_workload


def _halves(batch: dict, size: int) -> list[dict]:
    return [{key: value[s : s + size // 2] for key, value in batch.items()} for s in (0, size // 2)]


def test_a_dits_class_label_dropout_is_switched_off_and_splits_then_agree() -> None:
    workload = get_workload("dit-tiny")
    torch.manual_seed(0)
    model = workload.build_model().train()
    batch = workload.make_batch(8, torch.device("cpu"))
    with torch.no_grad():
        # classifier-free guidance's label dropout: each call draws its own labels dropped
        draws = {round(workload.loss(model, batch).item(), 6) for _ in range(6)}
    assert len(draws) > 1
    switched = switch_off_dropout(model)
    assert switched >= 1
    assert all(getattr(m, "dropout_prob", 0.0) == 0.0 for m in model.modules())
    with torch.no_grad():
        whole = workload.loss(model, batch).item()
        split = sum(workload.loss(model, half).item() for half in _halves(batch, 8)) / 2
    assert abs(split - whole) <= 1e-6 * abs(whole)


def test_torch_dropout_modules_are_counted_and_zeroed() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.1), torch.nn.Dropout2d())
    assert switch_off_dropout(model) == 2
    assert [m.p for m in model if isinstance(m, torch.nn.modules.dropout._DropoutNd)] == [0, 0]
