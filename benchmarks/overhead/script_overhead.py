"""Per-probe overhead of a script probe, warm ranks against a launch per probe, side by side.

A study of the user's own script (``autotune run --script``, an example of ``examples/``
copied to a scratch folder) is run twice per repeat, interleaved: with warm ranks (the
default: the script's ``__main__`` run again per candidate in the same processes) and with
``--cold-probes`` (one torchrun launch per probe). Every probe runs exactly 2 warm-up and 3
timed steps (adaptive length, early stop and the confirmation round off; the grid sampler,
so both studies probe the same candidates in the same order). Per probe: overhead = probe
wall (launch or job post -> result) minus the time inside its timed steps. The first probe
of a warm study starts its group, as a cold one does: the table gives it apart.

Reproduce:
    python benchmarks/overhead/script_overhead.py                    # vision_deepspeed
    python benchmarks/overhead/script_overhead.py --example hf_trainer --repeats 2
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.autotune_cli import autotune_cli

ROOT = Path(__file__).resolve().parents[2]
SPACE = "precision: [fp32]\nzero_stage: [0, 1]\nmicro_batch_size: [2, 4, 8]\n"
HF_ARGS = [
    "--deepspeed", "ds_config.json", "--output_dir", "out", "--max_steps", "1000",
    "--per_device_train_batch_size", "4", "--gradient_accumulation_steps", "2",
    "--report_to", "none", "--save_strategy", "no", "--disable_tqdm", "true",
    "--logging_strategy", "no",
]  # fmt: skip
ARGS = {
    "vision_deepspeed": ["--", "--deepspeed", "--deepspeed_config", "ds_config.json"],
    "hf_trainer": ["--", *HF_ARGS],
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--example", choices=sorted(ARGS), default="vision_deepspeed")
    parser.add_argument("--probes", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--gpus", type=int, default=2)
    args = parser.parse_args()
    rows: dict[str, list[list[float]]] = {"warm": [], "cold": []}
    for repeat in range(args.repeats):
        for mode in ("warm", "cold") if repeat % 2 == 0 else ("cold", "warm"):
            rows[mode].append(_study(args, mode))
    print(
        f"\n### Script probe overhead, examples/{args.example}, {args.gpus} CPU ranks, "
        f"{args.probes} probes per study, {args.repeats} repeat(s) each, interleaved\n"
    )
    print("| ranks | first probe overhead (s) | later probes' overhead, median (s) | spread |")
    print("| --- | --- | --- | --- |")
    for mode, studies in rows.items():
        firsts = [s[0] for s in studies]
        later = [v for s in studies for v in s[1:]]
        print(
            f"| {mode} | {statistics.median(firsts):.1f} | {statistics.median(later):.1f} | "
            f"{min(later):.1f}-{max(later):.1f} |"
        )
    warm = statistics.median(v for s in rows["warm"] for v in s[1:])
    cold = statistics.median(v for s in rows["cold"] for v in s[1:])
    print(f"\nwarm / cold, later probes: {warm / cold:.2f}")
    return 0


def _study(args: argparse.Namespace, mode: str) -> list[float]:
    """One study's probes' overheads (probe wall - timed steps), in probe order."""
    import optuna

    with tempfile.TemporaryDirectory(prefix="script-overhead-") as scratch:
        folder = Path(scratch) / args.example
        shutil.copytree(ROOT / "examples" / args.example, folder)
        (folder / "space.yaml").write_text(SPACE)
        autotune_cli(
            folder, "run", "--script", "train.py", "--gpus", str(args.gpus), "--space",
            "space.yaml", "--max-trials", str(args.probes), "--budget", "20m", "--executor",
            "local", "--sampler", "grid", "--no-confirm", "--no-early-stop", "--warmup-steps",
            "2", "--timed-steps", "3", "--max-timed-steps", "3", "--quiet",
            *(["--cold-probes"] if mode == "cold" else []), *ARGS[args.example],
        )  # fmt: skip
        optuna.logging.set_verbosity(optuna.logging.ERROR)
        storage = f"sqlite:///{folder}/trials/autotune.db"
        study = optuna.load_study(study_name="train", storage=storage)
        attrs = [t.user_attrs for t in study.trials if "probe_wall_s" in t.user_attrs]
        return [a["probe_wall_s"] - a.get("probe_timed_s", 0.0) for a in attrs]


if __name__ == "__main__":
    raise SystemExit(main())
