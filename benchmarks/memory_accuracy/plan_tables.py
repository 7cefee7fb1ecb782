"""Per-GPU memory that `autotune plan`'s memory model predicts for published training claims:
DiT-B/8, DiT-L/4 and DiT-XL/2 at batch sizes 8-256 on 1, 2, 4 and 8 GPUs, ZeRO 0-3, fp32 /
bf16 / fp16, activation checkpointing off and on; and Llama 70B on 4 x 80 GiB with ZeRO-3 and
CPU offload (host RAM per node). No GPU is used: the model traces activations on fake
tensors, with CUDA's attention and dropout kernels.

Reproduce (about 5 minutes on 2 CPU cores):
    python benchmarks/memory_accuracy/plan_tables.py --write docs/plans.md

``--write`` replaces the generated part of the document (between its ``plan_tables``
markers) and writes every predicted cell to
``benchmarks/memory_accuracy/data/plan_tables.csv``; without it the tables go to stdout.
"""

from __future__ import annotations

import argparse
import csv
import itertools
import re
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
GiB = 2**30
GB = 1e9

# The write-up's figures: GB per GPU in fp32 ("halved with FP16"); no batch size given.
DIT_CLAIMS = {"dit-b-8": 12, "dit-l-4": 24, "dit-xl-2": 48}
BATCHES = (8, 16, 32, 64, 128, 256)
GPUS = (1, 2, 4, 8)
STAGES = (0, 1, 2, 3)
PRECISIONS = ("fp32", "bf16", "fp16")
BEGIN, END = "<!-- plan_tables:begin -->", "<!-- plan_tables:end -->"
# Llama 70B's rows: (optimizer offload, parameter offload, checkpointing, per-GPU batch)
LLAMA_SHAPES = (
    ("cpu", "none", True, 1),
    ("cpu", "none", True, 4),
    ("cpu", "none", False, 1),
    ("cpu", "cpu", True, 1),
    ("cpu", "cpu", True, 4),
    ("cpu", "cpu", False, 1),
)


def _candidate(precision: str, stage: int, per_gpu: int, gpus: int, ckpt: bool, **kw):
    """A candidate without accumulation (the memory of one micro-batch of ``per_gpu``)."""
    from autotune.candidate import Candidate

    return Candidate(
        precision=precision,
        zero_stage=stage,
        micro_batch_size=per_gpu,
        gradient_accumulation_steps=kw.pop("accumulation", 1),
        data_parallel_size=gpus,
        activation_checkpointing=ckpt,
        **kw,
    )


def paper_model_states(params: float, precision: str, stage: int, gpus: int) -> float:
    """Bytes of model states per GPU with Adam by the ZeRO paper (sec. 3.1 and 5.1): mixed
    precision 2 + 2 + 12 bytes per parameter (16-bit weights and gradients; fp32 master
    weights, momentum and variance), fp32 4 + 4 + 8; ZeRO-1 partitions the optimizer
    states, ZeRO-2 also the gradients, ZeRO-3 also the weights."""
    width, optimizer = (4.0, 8.0) if precision == "fp32" else (2.0, 12.0)
    weights, grads = width * params, width * params
    if stage >= 1:
        optimizer /= gpus
    if stage >= 2:
        grads /= gpus
    if stage >= 3:
        weights /= gpus
    return weights + grads + optimizer * params


def dit_grid() -> list[dict]:
    """Every cell of per-GPU batch x GPUs x ZeRO stage x precision x checkpointing (global
    batch = per-GPU batch x GPUs, no accumulation)."""
    from autotune.memory import MemoryModel, model_facts, profile
    from autotune.workloads import get_workload

    rows = []
    for name in DIT_CLAIMS:
        workload = get_workload(name)
        model = MemoryModel(workload, accelerator="cuda")
        params = model_facts(workload, 100_000).params
        for precision, batch, gpus, stage, ckpt in itertools.product(
            PRECISIONS, BATCHES, GPUS, STAGES, (False, True)
        ):
            estimate = model.predict(_candidate(precision, stage, batch, gpus, ckpt))
            # activations alone: gradients released as produced (not counted twice)
            act = profile(workload, batch, precision, ckpt, "dropped", "cuda")
            activations = max(act.forward_peak_bytes, act.backward_peak_bytes)
            states = paper_model_states(params, precision, stage, gpus)
            rows.append(
                {
                    "workload": name,
                    "precision": precision,
                    "per_gpu_batch": batch,
                    "gpus": gpus,
                    "global_batch": batch * gpus,
                    "zero_stage": stage,
                    "checkpointing": ckpt,
                    "deepspeed_gib": round(estimate.device_bytes / GiB, 3),
                    "deepspeed_peak_phase": estimate.phase,
                    "paper_model_states_gib": round(states / GiB, 3),
                    "activations_gib": round(activations / GiB, 3),
                    "paper_total_gib": round((states + activations) / GiB, 3),
                }
            )
    return rows


def _cell(rows: list[dict], **key) -> dict:
    (row,) = [r for r in rows if all(r[k] == v for k, v in key.items())]
    return row


def _gib(value: float, budget_gb: float | None = None) -> str:
    """GiB, bold when within the budget (given in GB, as the write-up's)."""
    text = f"{value:.1f}"
    return f"**{text}**" if budget_gb is not None and value * GiB <= budget_gb * GB else text


def dit_tables(rows: list[dict]) -> str:
    return "\n".join(dit_batch_tables(rows) + dit_fit_table(rows)) + "\n"


def dit_batch_tables(rows: list[dict]) -> list[str]:
    """Per model: GiB per GPU on 1 GPU by per-GPU batch, by the paper and by DeepSpeed."""
    from autotune.memory import model_facts
    from autotune.workloads import get_workload

    out = [
        "### 1 GPU (or data parallel without ZeRO), by per-GPU batch\n",
        "GiB per GPU, activation checkpointing off. *Paper*: model states by the ZeRO paper "
        "(16 bytes per parameter with Adam in fp32 and in mixed precision alike) plus the "
        "traced activations. *DeepSpeed*: what `autotune plan` predicts DeepSpeed 0.19 "
        "allocates at ZeRO-0 (its buffers included). Bold: within the write-up's figure "
        "(fp32) or half of it (16-bit). fp16 and bf16 have the same sizes.\n",
    ]
    for name, claim in DIT_CLAIMS.items():
        workload = get_workload(name)
        params = model_facts(workload, 100_000).params
        out.append(
            f"\n**{name}**: {params / 1e6:.0f}M parameters (diffusers' port), "
            f"{workload.tokens_per_sample} tokens per image; model states "
            f"{16 * params / GiB:.1f} GiB in either precision. Claim: {claim} GB fp32, "
            f"{claim / 2:g} GB 16-bit.\n"
        )
        out.append(
            "| per-GPU batch | activations fp32 | activations 16-bit | paper fp32 "
            "| paper 16-bit | 16-bit / fp32 | DeepSpeed fp32 | DeepSpeed bf16 |"
        )
        out.append("|---|---|---|---|---|---|---|---|")
        for batch in BATCHES:
            key = {"workload": name, "per_gpu_batch": batch, "gpus": 1, "zero_stage": 0}
            fp32 = _cell(rows, precision="fp32", checkpointing=False, **key)
            bf16 = _cell(rows, precision="bf16", checkpointing=False, **key)
            out.append(
                f"| {batch} | {_gib(fp32['activations_gib'])} | "
                f"{_gib(bf16['activations_gib'])} | "
                f"{_gib(fp32['paper_total_gib'], claim)} | "
                f"{_gib(bf16['paper_total_gib'], claim / 2)} | "
                f"{bf16['paper_total_gib'] / fp32['paper_total_gib']:.2f} | "
                f"{_gib(fp32['deepspeed_gib'], claim)} | "
                f"{_gib(bf16['deepspeed_gib'], claim / 2)} |"
            )
    return out


def dit_fit_table(rows: list[dict]) -> list[str]:
    """The largest per-GPU batch within the write-up's figure, by ZeRO stage and GPUs."""
    header = " | ".join(f"{g} GPU{'s' if g > 1 else ''}" for g in GPUS)
    out = [
        "\n### Largest per-GPU batch within the figure, by ZeRO stage and GPUs\n\n"
        "The largest per-GPU batch of 8-256 whose predicted DeepSpeed peak fits the "
        "write-up's figure (fp32) or half of it (16-bit); in brackets with activation "
        "checkpointing. The global batch is this times the GPUs. `-`: not even 8.\n",
        f"| model | ZeRO | fp32: {header} | 16-bit: {header} |",
        "|---|---|" + "---|" * (2 * len(GPUS)),
    ]
    for name, claim in DIT_CLAIMS.items():
        for stage in STAGES:
            cells = []
            for precision, budget in (("fp32", claim), ("bf16", claim / 2)):
                for gpus in GPUS:
                    best = []
                    for ckpt in (False, True):
                        fitting = [
                            r["per_gpu_batch"]
                            for r in rows
                            if r["workload"] == name
                            and r["precision"] == precision
                            and r["gpus"] == gpus
                            and r["zero_stage"] == stage
                            and r["checkpointing"] == ckpt
                            and r["deepspeed_gib"] * GiB <= budget * GB
                        ]
                        best.append(str(max(fitting)) if fitting else "-")
                    cells.append(f"{best[0]} ({best[1]})")
            out.append(f"| {name} | {stage} | " + " | ".join(cells) + " |")
    return out


def llama_tables() -> str:
    """Llama 70B with ZeRO-3 and CPU offload on 4 x 80 GiB: device per GPU, host per node."""
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs

    from autotune.memory import MemoryModel, largest_layer_params, model_facts
    from autotune.workloads import get_workload

    out = [
        "| model | offload | ckpt | per-GPU batch | device GiB per GPU | fits 80 GiB "
        "| host GiB per node | paper host GiB | DeepSpeed estimator: GPU / host GiB |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    gpus = 4
    for name in ("llama-70b", "llama3-70b"):
        workload = get_workload(name)
        model = MemoryModel(workload, accelerator="cuda")
        facts = model_facts(workload, 100_000)
        largest = largest_layer_params(workload)
        for opt, param, ckpt, batch in LLAMA_SHAPES:
            candidate = _candidate(
                "bf16",
                3,
                batch,
                gpus,
                ckpt,
                offload_optimizer=opt,
                offload_param=param,
            )
            estimate = model.predict(candidate)
            # DeepSpeed's estimator: model states only, host with its 1.5 buffer factor
            cpu_ds, gpu_ds, _ = estimate_zero3_model_states_mem_needs(
                facts.params,
                largest,
                num_gpus_per_node=gpus,
                num_nodes=1,
                cpu_offload=True,
                cpu_offload_params=param == "cpu",
                zero_init=True,
            )
            # ZeRO-Offload (Ren et al. 2021, sec. 4.1): fp32 master weights, momentum,
            # variance and gradients on the host, 16 bytes per parameter; + 2 with the
            # 16-bit parameters offloaded as well (ZeRO-Infinity)
            paper_host = (16 + (2 if param == "cpu" else 0)) * facts.params
            out.append(
                f"| {name} | opt:{opt}"
                + (f" param:{param}" if param != "none" else "")
                + f" | {'on' if ckpt else 'off'} | {batch} | {estimate.device_bytes / GiB:.1f} "
                f"| {'yes' if estimate.device_bytes <= 0.95 * 80 * GiB else 'no'} "
                f"| {estimate.host_bytes * gpus / GiB:.0f} | {paper_host / GiB:.0f} "
                f"| {gpu_ds / GiB:.1f} / {cpu_ds / GiB:.0f} |"
            )
    return "\n".join(out) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", type=Path, help="the document whose tables to replace")
    parser.add_argument("--csv", type=Path, default=HERE / "data" / "plan_tables.csv")
    args = parser.parse_args()
    started = time.monotonic()
    rows = dit_grid()
    text = (
        "## DiT: the write-up's per-GPU figures\n\n"
        + dit_tables(rows)
        + "\n## Llama 70B on 4 x 80 GiB with ZeRO-3 and CPU offload\n\n"
        + "bf16, sequence 2048; host memory is what the node's 4 ranks hold together.\n\n"
        + llama_tables()
        + "\n_Generated by `python benchmarks/memory_accuracy/plan_tables.py --write docs/plans.md`"
        f" in {time.monotonic() - started:.0f} s; every cell of the DiT grid (batch 8-256 x 1, "
        "2, 4, 8 GPUs x ZeRO 0-3 x fp32/bf16/fp16 x checkpointing) is in "
        "`benchmarks/memory_accuracy/data/plan_tables.csv`._\n"
    )
    if args.write is None:
        print(text)
        return 0
    document = args.write.read_text(encoding="utf-8")
    if BEGIN not in document or END not in document:
        print(f"{args.write}: no {BEGIN} ... {END} markers to write between", file=sys.stderr)
        return 2
    pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.DOTALL)
    args.write.write_text(
        pattern.sub(lambda _: f"{BEGIN}\n{text}{END}", document), encoding="utf-8"
    )
    args.csv.parent.mkdir(parents=True, exist_ok=True)
    with args.csv.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {args.write} and {args.csv}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
