"""What a rank reads of its engine after the timed steps (autotune/probe/_engine_state.py),
on a real torch optimizer. DeepSpeed's engine and its fp16 and ZeRO wrappers cannot be built
without a process group here: ``Wrapper`` stands in for their shape (``.optimizer`` holding
the optimizer that steps, the fp16 scaler's ``cur_scale``), a fake named so; the GPU check's
dry run reads real engines (tests/benchmarks/test_gpu_check.py)."""

from __future__ import annotations

from typing import Any

import torch

from autotune.probe._engine_state import (
    host_tensor_bytes,
    loss_scale,
    optimizer_name,
    stepping_optimizer,
)


class Wrapper:
    """Fake of a DeepSpeed fp16 or ZeRO optimizer: holds the optimizer that steps."""

    def __init__(self, optimizer: Any, cur_scale: float | None = None) -> None:
        self.optimizer = optimizer
        if cur_scale is not None:
            self.cur_scale = cur_scale


class Engine:
    """Fake of a DeepSpeed engine: its optimizer and whether it trains in fp16."""

    def __init__(self, optimizer: Any, fp16: bool = False) -> None:
        self.optimizer = optimizer
        self._fp16 = fp16

    def fp16_enabled(self) -> bool:
        return self._fp16


def stepped_adamw() -> torch.optim.AdamW:
    weight = torch.nn.Parameter(torch.ones(256, 64))
    optimizer = torch.optim.AdamW([weight])
    weight.sum().backward()
    optimizer.step()
    return optimizer


def test_the_optimizer_that_steps_is_named_through_a_wrapper_or_alone() -> None:
    adamw = stepped_adamw()
    assert stepping_optimizer(Engine(Wrapper(adamw))) is adamw
    assert stepping_optimizer(Engine(adamw)) is adamw
    assert optimizer_name(Engine(Wrapper(adamw))) == "torch.optim.adamw.AdamW"
    assert optimizer_name(Engine(None)) == ""


def test_host_tensors_are_its_parameters_gradients_and_states_each_once() -> None:
    adamw = stepped_adamw()
    weight_bytes = 256 * 64 * 4
    # the weight, its gradient, exp_avg and exp_avg_sq (the step count is a scalar tensor)
    pinned, pageable = host_tensor_bytes(adamw)
    assert pinned == 0  # no page-locked memory without CUDA
    assert 4 * weight_bytes <= pageable <= 4 * weight_bytes + 64
    assert host_tensor_bytes(None) == (0, 0)


def test_the_fp16_loss_scale_is_read_only_from_an_fp16_engine() -> None:
    adamw = stepped_adamw()
    assert loss_scale(Engine(Wrapper(adamw, cur_scale=2.0**15), fp16=True)) == 2.0**15
    assert loss_scale(Engine(Wrapper(adamw, cur_scale=1.0), fp16=False)) == 0.0
    assert loss_scale(Engine(Wrapper(adamw), fp16=True)) == 0.0  # no scaler held
