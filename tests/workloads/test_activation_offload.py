"""Activation offload: the kept blocks' saved activations moved to the host by saved-tensor
hooks (here from CPU to CPU, through the same copies), parameters and small tensors left
where they are, gradients as without, and only the blocks that are not recomputed wrapped."""

from __future__ import annotations

import functools

import pytest
import torch

from autotune.workloads import get_workload


class _Block(torch.nn.Module):
    """Saves its input (the first addmm), the first output and the second weight's
    transpose (the second addmm), the tanh's output, a 64-byte view of it and a 2-element
    parameter (the mul)."""

    def __init__(self) -> None:
        super().__init__()
        self.first = torch.nn.Linear(64, 64)
        self.linear = torch.nn.Linear(64, 64)
        self.scale = torch.nn.Parameter(torch.ones(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = torch.tanh(self.linear(self.first(x)))
        return hidden + (hidden[:, :2] * self.scale).sum()


def test_the_hooks_move_activations_and_leave_parameters_and_small_tensors() -> None:
    from autotune.workloads.activation_offload import OffloadLedger, offload_blocks

    torch.manual_seed(0)
    plain, offloaded = _Block(), _Block()
    offloaded.load_state_dict(plain.state_dict())
    ledger = OffloadLedger()
    offload_blocks([offloaded], host="cpu", ledger=ledger)
    inputs = torch.randn(8, 64)
    for model in (plain, offloaded):
        model(inputs).sum().backward()
    # the input, the first output and the tanh's output (8 x 64 fp32 each) moved; the
    # weight's transpose and the scale are parameters, the 8 x 2 view is under 1024 bytes
    assert (ledger.packed, ledger.packed_bytes) == (3, 3 * 8 * 64 * 4)
    assert (ledger.skipped_parameters, ledger.skipped_small) == (2, 1)
    assert ledger.peak_host_bytes == ledger.packed_bytes and ledger.host_bytes == 0
    for a, b in zip(plain.parameters(), offloaded.parameters(), strict=True):
        assert torch.equal(a.grad, b.grad)


def test_autocasts_copies_of_the_weights_stay_on_the_device() -> None:
    """Under autocast a linear layer saves its weight cast to bf16 (a tensor autograd made
    from the parameter): a parameter's stand-in, not an activation to move."""
    from autotune.workloads.activation_offload import OffloadLedger, offload_saved_tensors

    block = _Block()
    inputs = torch.randn(8, 64)
    ledger = OffloadLedger()
    with torch.autocast("cpu", dtype=torch.bfloat16), offload_saved_tensors("cpu", ledger):
        block(inputs).float().sum().backward()
    # the two bf16 weights (and their transposes) are casts of parameters: left; the
    # activations (bf16 input and first output, the tanh's output) moved
    assert ledger.packed == 3, ledger
    assert ledger.skipped_parameters >= 2


def test_pinned_host_copies_are_counted_as_the_host_allocator_rounds_them() -> None:
    from autotune.workloads.activation_offload import pinned_bytes

    assert [pinned_bytes(n) for n in (1, 1024, 1025, 6 * 2**20, 24 * 2**20)] == [
        1,
        1024,
        2048,
        8 * 2**20,
        32 * 2**20,
    ]


def test_no_offload_packs_nothing() -> None:
    from autotune.workloads.activation_offload import OffloadLedger, offload_saved_tensors

    ledger = OffloadLedger()
    block = _Block()
    block(torch.randn(8, 64)).sum().backward()
    with offload_saved_tensors("cpu", ledger, min_bytes=10**9):
        block(torch.randn(8, 64)).sum().backward()
    assert ledger.packed == 0 and ledger.skipped_small >= 2


@pytest.mark.parametrize("name", ["gpt-tiny", "dit-tiny"])
@pytest.mark.parametrize("fraction", [0.0, 0.5])
def test_the_kept_blocks_offload_and_train_as_without(name: str, fraction: float) -> None:
    """With the first half recomputed (or none), exactly the other blocks run under the
    hooks, and the gradients equal those of the model that keeps everything on the
    device."""
    from autotune.workloads import activation_offload
    from autotune.workloads.checkpointing import apply_checkpointing

    workload = get_workload(name).with_layers(4)
    ledgers: list[activation_offload.OffloadLedger] = []

    def trained(offload: str) -> tuple[torch.nn.Module, list[torch.Tensor]]:
        torch.manual_seed(0)
        model = workload.build_model()
        apply_checkpointing(workload, model, fraction)
        activation_offload.apply_offload(workload, model, fraction, offload)
        for block in workload.checkpoint_blocks(model):  # count what the hooks moved
            forward = block.forward
            if getattr(forward, "func", None) is activation_offload._offloaded_forward:
                ledgers.append(activation_offload.OffloadLedger())
                block.forward = functools.partial(forward.func, *forward.args[:2], ledgers[-1])
        model.train()
        torch.manual_seed(1)
        workload.loss(model, workload.make_batch(2, torch.device("cpu"))).backward()
        return model, [p.grad.clone() for p in model.parameters() if p.grad is not None]

    _, on_device = trained("none")
    assert not ledgers
    model, on_host = trained("cpu")
    for a, b in zip(on_device, on_host, strict=True):
        assert torch.equal(a, b)
    wrapped = [
        isinstance(block.forward, functools.partial)
        and block.forward.func is activation_offload._offloaded_forward
        for block in workload.checkpoint_blocks(model)
    ]
    assert wrapped == ([False, False, True, True] if fraction else [True] * 4)
    assert len(ledgers) == wrapped.count(True)
    assert all(ledger.packed > 0 and ledger.host_bytes == 0 for ledger in ledgers)
