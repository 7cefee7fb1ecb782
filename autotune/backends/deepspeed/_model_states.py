"""The model states a rank holds under DeepSpeed's ZeRO after the first optimizer step.

They follow the ZeRO paper (Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward
Training Trillion Parameter Models", sec. 5: with mixed precision and Adam a parameter costs
2 + 2 + 12 bytes, of which ZeRO-1 partitions the 12 optimizer bytes, ZeRO-2 also the 2
gradient bytes, ZeRO-3 also the 2 parameter bytes) as DeepSpeed 0.19 holds them: ZeRO-1/2
hold no gradient between steps, where DeepSpeed's estimators
(``estimate_zero2/3_model_states_mem_needs``) count a gradient partition. What DeepSpeed
allocates on top of them, phase by phase, is in :mod:`._zero_phases`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from autotune.backends._memory_terms import Breakdown

if TYPE_CHECKING:
    from autotune.backends._memory_terms import ModelFacts
    from autotune.candidate import Candidate


def zero_model_states(candidate: Candidate, facts: ModelFacts) -> tuple[Breakdown, Breakdown]:
    """Steady (device, host) model states per rank after the first optimizer step."""
    p, n = float(facts.params), float(candidate.data_parallel_size)
    stage = candidate.zero_stage
    mixed = candidate.precision != "fp32"
    width = 2.0 if mixed else 4.0  # bytes of a parameter (and its gradient) as trained
    params = width * p
    if stage == 3:
        persistent = width * facts.small_params
        params = persistent + width * (p - facts.small_params) / n
    # Optimizer: fp32 master copy (kept even in fp32 from ZeRO-1 on) + Adam m and v.
    if stage == 0 and not mixed:
        master, adam, grads = 0.0, 8.0 * p, 0.0  # gradients are freed by zero_grad
    elif stage == 0:
        # BF16_Optimizer: partitioned master and Adam, a whole-model fp32 gradient
        # buffer and the bf16 gradients.
        master, adam, grads = 4.0 * p / n, 8.0 * p / n, 4.0 * p + width * p
    else:
        master, adam = 4.0 * p / n, 8.0 * p / n
        grads = width * p / n if stage == 3 else 0.0
    optimizer = master + adam
    device = Breakdown(params=params, grads=grads, optimizer_states=optimizer)
    host = Breakdown()
    ratio = candidate.offload_optimizer_ratio
    if candidate.offload_optimizer != "none" and stage >= 1:
        moved = optimizer * ratio
        device.optimizer_states -= moved
        if candidate.offload_optimizer == "cpu":
            host.optimizer_states += moved
            # gradients are copied to the host partition for CPU Adam
            host.grads += 4.0 * p / n * ratio
        device.grads *= 1.0 - ratio  # ZeRO-3's gradient partition follows them
    if candidate.offload_param != "none" and stage == 3:
        moved = device.params
        device.params = 0.0
        if candidate.offload_param == "cpu":
            host.params += moved
    return device, host
