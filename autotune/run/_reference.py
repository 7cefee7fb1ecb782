"""The reference a winner's training is compared with (``autotune verify``): what the
user would train with without autotune, at the winner's global batch and ranks.

The rule, first that applies:

1. **The user's base config** (``--base-config``; a script's: the config file it names, else
   the config it passes to ``deepspeed.initialize``), as DeepSpeed reads it: the precision,
   ZeRO stage, offload and batch split it sets, DeepSpeed's defaults for what it leaves
   out (fp32, ZeRO-0, no offload; with neither a micro-batch nor an accumulation, the
   rank's whole share of the global batch in one micro-batch). It is the user's own
   training, fits or not.
2. **fp32 at ZeRO-0 without offload**, where the memory model (with what the study's
   probes taught it) says it fits: the largest micro-batch that does, so that what depends
   on the micro-batch (batch statistics, a loss averaged per micro-batch) shows against a
   winner that splits the batch finer.
3. **The smallest change from the winner that is fp32**: the winner in fp32, else with
   ZeRO-3, then the optimizer and then the parameters offloaded to the CPU, the first the
   memory model says fits (the winner in fp32 when none does: it may not fit).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from autotune.candidate import Candidate, Precision

Rule = Literal["base config", "fp32 ZeRO-0", "fp32 nearest the winner"]


class Reference(BaseModel):
    """The reference chosen, and why."""

    model_config = ConfigDict(extra="forbid")

    candidate: Candidate = Field(description="The configuration the reference trains with.")
    rule: Rule = Field(description="Which step of the rule chose it.")
    reason: str = Field(description="One line: why this reference.")


def choose_reference(
    winner: Candidate,
    base_config: dict[str, Any] | None,
    fits: Callable[[Candidate], bool],
    base_source: str = "your base config",
) -> Reference:
    """The reference for ``winner`` by the rule of the module docstring; ``fits`` is the
    memory model's word on a candidate, ``base_source`` names where ``base_config`` came
    from."""
    if base_config is not None:
        candidate = from_base_config(winner, base_config)
        return Reference(
            candidate=candidate,
            rule="base config",
            reason=f"{base_source} as DeepSpeed reads it ({candidate.label})",
        )
    per_rank = winner.train_batch_size // winner.data_parallel_size
    for micro in sorted(_divisors(per_rank), reverse=True):
        for fraction in dict.fromkeys([0.0, winner.checkpoint_fraction]):
            candidate = Candidate(
                precision="fp32",
                zero_stage=0,
                micro_batch_size=micro,
                gradient_accumulation_steps=per_rank // micro,
                data_parallel_size=winner.data_parallel_size,
                checkpoint_fraction=fraction,
            )
            if fits(candidate):
                return Reference(
                    candidate=candidate,
                    rule="fp32 ZeRO-0",
                    reason="fp32 at ZeRO-0 without offload, the largest micro-batch the memory "
                    "model says fits",
                )
    return _nearest_fp32(winner, fits)


def _nearest_fp32(winner: Candidate, fits: Callable[[Candidate], bool]) -> Reference:
    """Rule 3: the winner in fp32, then with ZeRO-3 and CPU offload, the first that fits."""
    fp32 = winner.model_copy(update={"precision": "fp32"})
    zero3 = fp32.model_copy(update={"zero_stage": 3})
    steps = [
        fp32,
        zero3,
        zero3.model_copy(update={"offload_optimizer": "cpu", "offload_optimizer_ratio": 1.0}),
        zero3.model_copy(
            update={
                "offload_optimizer": "cpu",
                "offload_optimizer_ratio": 1.0,
                "offload_param": "cpu",
            }
        ),
    ]
    for candidate in steps:
        if fits(candidate):
            return Reference(
                candidate=candidate,
                rule="fp32 nearest the winner",
                reason="fp32 at ZeRO-0 does not fit at this global batch: the smallest change "
                "from the winner that is fp32 and fits",
            )
    return Reference(
        candidate=fp32,
        rule="fp32 nearest the winner",
        reason="no fp32 configuration near the winner fits by the memory model: the winner in "
        "fp32, which may not fit",
    )


def from_base_config(winner: Candidate, base: dict[str, Any]) -> Candidate:
    """The candidate ``base`` describes at ``winner``'s global batch and ranks, with
    DeepSpeed's defaults for what it leaves out."""
    zero = dict(base.get("zero_optimization") or {})
    ranks = winner.data_parallel_size
    per_rank = winner.train_batch_size // ranks
    micro = base.get("train_micro_batch_size_per_gpu")
    accumulation = base.get("gradient_accumulation_steps")
    if isinstance(micro, int) and per_rank % micro == 0:
        accumulation = per_rank // micro
    elif isinstance(accumulation, int) and per_rank % accumulation == 0:
        micro = per_rank // accumulation
    else:  # DeepSpeed: a train_batch_size alone is one micro-batch per rank
        micro, accumulation = per_rank, 1
    return Candidate(
        precision=_base_precision(base),
        zero_stage=int(zero.get("stage", 0)),  # type: ignore[arg-type]
        offload_optimizer=_device(zero.get("offload_optimizer")),
        offload_param=_device(zero.get("offload_param")),
        offload_optimizer_ratio=float((zero.get("offload_optimizer") or {}).get("ratio", 1.0)),
        micro_batch_size=micro,
        gradient_accumulation_steps=accumulation,
        data_parallel_size=ranks,
    )


def _base_precision(base: dict[str, Any]) -> Precision:
    """fp16 or bf16 where the base config enables it (DeepSpeed also reads "bfloat16")."""
    if (base.get("fp16") or {}).get("enabled"):
        return "fp16"
    if (base.get("bf16") or base.get("bfloat16") or {}).get("enabled"):
        return "bf16"
    return "fp32"


def _device(block: Any) -> Literal["none", "cpu", "nvme"]:
    device = (block or {}).get("device", "none") if isinstance(block, dict) else "none"
    return device if device in ("cpu", "nvme") else "none"


def _divisors(number: int) -> list[int]:
    return [d for d in range(1, number + 1) if number % d == 0]
