"""The GPU check's phases (benchmarks/gpu_check.py runs them in this order).

Each phase gets the run and its own record; it runs commands through ``run.run`` (its time
limit applies), adds checks and data to the record, and raises ``Skip`` where it does not
apply here. What the commands measure is judged in benchmarks/gpu_check_report.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpu_check import REPO, OverTime, Phase, Run, Skip
from gpu_check_report import (
    GiB,
    MiB,
    check,
    gpu_tests_checks,
    memory_checks,
    memory_summary,
    oom_checks,
    oom_limit,
    precision_offload_checks,
    pytest_outcomes,
    study_checks,
    study_summary,
    train_checks,
)

PROBES = str(REPO / "benchmarks" / "gpu_check_probes.py")
TRAIN = str(REPO / "benchmarks" / "gpu_check_train.py")
NVME_MIN_FREE_BYTES = 8 * GiB  # GPT-2's optimizer and parameter swap files with room to spare
SMOKE = "import autotune.cli, autotune.probe, deepspeed, optuna, sqlalchemy, alembic, pydantic"
DIT_PREFERRED = ("dit-b-2", "dit-s-2")
VERSION_KEYS = (
    "python",
    "torch",
    "torch_cuda",
    "cudnn",
    "nccl",
    "driver",
    "deepspeed",
    "optuna",
    "transformers",
    "diffusers",
    "pydantic",
    "sqlalchemy",
    "autotune",
)


# ---------------------------------------------------------------- install


def make_venv(run: Run, phase: Phase, venv: Path) -> None:
    """A venv that sees the running interpreter's packages (the node's torch). Where that
    interpreter is itself a venv, ``--system-site-packages`` would expose the base Python's
    instead, so its site folders are added by a .pth line (which also runs their .pth
    files) after the new venv's own."""
    base = sys.prefix == sys.base_prefix
    flags = ["--system-site-packages"] if base else []
    code, out = run.run(phase, [sys.executable, "-m", "venv", "--without-pip", *flags, str(venv)])
    if code:
        raise RuntimeError(f"python -m venv failed: {out[-500:]}")
    python = venv / "bin" / "python"
    if not base:
        own = run_python(
            run, phase, str(python), "import sysconfig; print(sysconfig.get_paths()['purelib'])"
        )
        outer = sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
        lines = [f"import site; site.addsitedir({path!r})" for path in outer]
        Path(own.strip(), "_gpu_check_outer_site.pth").write_text("\n".join(lines) + "\n")
    run.python = str(python)


def run_python(run: Run, phase: Phase, python: str, code: str) -> str:
    status, out = run.run(phase, [python, "-c", code])
    if status:
        raise RuntimeError(f"{python} -c {code[:60]!r} failed: {out[-800:]}")
    return out


def install_libaio(run: Run, phase: Phase, debs: list[Path]) -> str:
    """Unpack carried libaio packages into a private prefix and point the compiler and the
    loader at it (DeepSpeed's async I/O op links it; NVMe offload needs that op)."""
    if Path("/usr/include/libaio.h").exists() or not debs:
        return "system" if Path("/usr/include/libaio.h").exists() else "absent"
    prefix = run.work / "libaio"
    for deb in debs:
        code, out = run.run(phase, ["dpkg-deb", "-x", str(deb), str(prefix)])
        if code:
            return f"unpacking {deb.name} failed: {out[-200:]}"
    include = prefix / "usr" / "include"
    libs = [str(p.parent) for p in prefix.rglob("libaio.so*")]
    for name, value in (("CPATH", str(include)), ("LIBRARY_PATH", libs[0] if libs else "")):
        run.env[name] = os.pathsep.join(filter(None, [value, run.env.get(name)]))
    run.env["LD_LIBRARY_PATH"] = os.pathsep.join(
        filter(None, [*libs[:1], run.env.get("LD_LIBRARY_PATH")])
    )
    return f"carried ({prefix})"


def phase_install(run: Run, phase: Phase) -> None:
    venv = run.work / "venv"
    make_venv(run, phase, venv)
    pip = [run.python, "-m", "pip", "--disable-pip-version-check", "install", "-q", "--no-index"]
    pip += ["--no-deps", "--no-compile"]
    wheels = sorted(run.args.wheels.glob("*.whl")) if run.args.wheels else []
    if run.args.wheels and not wheels:
        raise RuntimeError(f"--wheels {run.args.wheels}: no .whl files there")
    if wheels:
        code, out = run.run(phase, [*pip, "--ignore-installed", *map(str, wheels)])
        phase.checks.append(check(f"{len(wheels)} carried wheels installed", code == 0, out[-400:]))
    debs = sorted(run.args.wheels.glob("deb/*.deb")) if run.args.wheels else []
    run.facts["libaio"] = install_libaio(run, phase, debs)
    code, out = run.run(phase, [*pip, "--no-build-isolation", "-e", str(REPO)])
    how = "pip install -e"
    if code:  # no setuptools >= 77 there: the tree on the path instead
        site = run_python(
            run, phase, run.python, "import sysconfig; print(sysconfig.get_paths()['purelib'])"
        )
        Path(site.strip(), "_gpu_check_autotune.pth").write_text(str(REPO) + "\n")
        how = f"a .pth line (pip install -e failed: {out.strip()[-200:]})"
    bin_dirs = [str(venv / "bin"), str(Path(sys.executable).parent)]
    cuda_bin = Path("/usr/local/cuda/bin")
    if cuda_bin.is_dir() and not shutil.which("nvcc", path=run.env.get("PATH")):
        bin_dirs.append(str(cuda_bin))  # torch's op builds call nvcc from PATH or CUDA_HOME
    run.env["PATH"] = os.pathsep.join([*bin_dirs, run.env.get("PATH", "")])
    run.env["TORCH_EXTENSIONS_DIR"] = ops_folder(run, phase)
    code, out = run.run(phase, [run.python, "-c", SMOKE])
    phase.checks.append(check("autotune and its dependencies import", code == 0, out[-600:]))
    if code:
        run.facts["abort"] = "autotune does not import in the check's venv (install phase)"
    code, out = run.run(phase, [run.python, "-m", "pip", "check"])
    phase.checks.append(check("pip check", None, out.strip()[-600:]))
    phase.summary = (
        f"venv {venv}; {len(wheels)} wheels; autotune by {how}; libaio {run.facts['libaio']}"
    )


def ops_folder(run: Run, phase: Phase) -> str:
    """Where DeepSpeed's ops are built, for every command of the check. A dry run takes the
    repository venv's folder (its ops are built already: nothing compiles on two cores); on
    a GPU a fresh one in the work folder."""
    if run.env.get("TORCH_EXTENSIONS_DIR"):
        return run.env["TORCH_EXTENSIONS_DIR"]
    if run.settings.dry_run:
        code = "from autotune.ops import torch_extensions_dir; print(torch_extensions_dir())"
        return run_python(run, phase, sys.executable, code).strip().splitlines()[-1]
    return str(run.work / "torch_extensions")


# ---------------------------------------------------------------- env, ops


def phase_env(run: Run, phase: Phase) -> None:
    code, out = run.run(phase, [run.python, PROBES, "env"])
    if code:
        raise RuntimeError(out[-800:])
    facts = json.loads(out.strip().splitlines()[-1])
    hardware = facts.get("hardware", {})
    run.facts.update(
        accelerator=hardware.get("accelerator"),
        device=hardware.get("device_name"),
        device_memory_bytes=hardware.get("device_memory_bytes"),
        host_memory_bytes=hardware.get("host_memory_bytes"),
        cpu_count=hardware.get("cpu_count"),
        detect_context_mib=facts.get("detect_context_mib"),
        dit_workloads=facts.get("dit_workloads", []),
        capability=facts.get("capability"),
    )
    run.facts["versions"] = {key: facts.get(key) for key in VERSION_KEYS}
    nvcc = shutil.which("nvcc", path=run.env.get("PATH"))
    run.facts["nvcc"] = nvcc
    phase.data = facts
    phase.summary = (
        f"{run.facts['device']} ({hardware.get('accelerator')}); torch {facts.get('torch')}"
    )
    context = facts.get("detect_context_mib")
    phase.checks.append(
        check(
            "the driver's hardware detection holds no CUDA context",
            None if context is None else context < 64,
            "no nvidia-smi here"
            if context is None
            else f"nvidia-smi memory.used grew {context} MiB across autotune.hardware.detect()",
        )
    )
    if not run.settings.dry_run and not run.cuda:
        run.facts["abort"] = "no CUDA GPU visible to torch (env phase)"
        raise RuntimeError("no CUDA GPU visible to torch: the GPU phases cannot run")


def phase_ops(run: Run, phase: Phase) -> None:
    """Build the ops side by side (each under its own lock), then let autotune confirm."""
    names = ["FusedAdamBuilder", "CPUAdamBuilder", "AsyncIOBuilder"]
    if not run.cuda:
        names.append("ShareMemCommBuilder")
    started = [(name, *run.start(phase, [run.python, PROBES, "build-op", name])) for name in names]
    codes = {}
    try:
        for name, process, log, _ in started:
            codes[name] = process.wait(timeout=max(phase.deadline - time.monotonic(), 0.1))
            log.close()
    except subprocess.TimeoutExpired:
        for _, process, log, _ in started:
            run.stop(process, interrupt_first=False)
            log.close()
        raise OverTime(f"op builds ran past {phase.timeout_s:.0f} s") from None
    code, out = run.run(phase, [run.python, "-m", "autotune.ops", "--build-ops"])
    run.facts["torch_adam"] = "FusedAdam does not build" in out
    nvme_note = next(
        (line for line in out.splitlines() if "NVMe offload is unavailable" in line), ""
    )
    run.facts["async_io"] = codes.get("AsyncIOBuilder") == 0 and not nvme_note
    run.facts["nvme_reason"] = nvme_note or (
        "" if run.facts["async_io"] else "async I/O op missing"
    )
    phase.data = {"build_exit_codes": codes, "autotune_ops": out.strip().splitlines()[-4:]}
    phase.checks += [
        check("autotune's op check passes", code == 0, out.strip()[-300:]),
        check("FusedAdam builds (else probes use torch's Adam)", not run.facts["torch_adam"], ""),
        check("CPU Adam builds", codes.get("CPUAdamBuilder") == 0, str(codes)),
        check(
            "async I/O builds (NVMe offload)",
            run.facts["async_io"] or None,
            run.facts["nvme_reason"],
        ),
    ]


# ---------------------------------------------------------------- memory, precision, offload


def phase_memory(run: Run, phase: Phase) -> None:
    s = run.settings
    device = int(run.facts.get("device_memory_bytes") or 0)
    if run.cuda:
        vram = device - 2 * GiB  # nothing should run out of memory here
    else:
        vram = min(20 * GiB, int(run.facts.get("host_memory_bytes") or 0) // 2)
    argv = [run.python, PROBES, "memory", "--root", str(run.work / "memory")]
    argv += ["--workload", s.workload, "--accelerator", "cuda" if run.cuda else "cpu"]
    argv += ["--precisions", *s.memory_precisions]
    argv += ["--micro-batches", *map(str, s.memory_micro_batches)]
    argv += ["--vram", str(vram), "--device-memory", str(device or vram), "--timeout-s", "300"]
    argv += ["--torch-adam"] * bool(run.facts.get("torch_adam"))
    design = "full" if run.args.full_memory else "half"
    nvme = nvme_folder(run)
    # a dry run probes NVMe last in the same launch (one cold start less on two cores)
    together = bool(nvme) and s.dry_run
    extras = ["--extras", "both", "--nvme", nvme] if together else ["--extras", "cpu"]
    rows = memory_rows(run, phase, [*argv, "--design", design, *extras], "memory")
    if nvme and not together:
        rows += nvme_rows(run, phase, argv, nvme)
    summary = memory_summary(rows)
    phase.data = {"workload": s.workload, "vram_limit_bytes": vram, "rows": rows}
    phase.data["summary"] = summary
    phase.checks += memory_checks(rows, "cuda" if run.cuda else "cpu", min_candidates=16)
    alloc = summary["allocated"]
    if alloc["n"]:
        phase.summary = (
            f"{alloc['n']} candidates: median |error| {100 * alloc['median_abs']:.2f}%, worst "
            f"{100 * alloc['worst_abs']:.2f}% vs allocated"
        )


def memory_rows(run: Run, phase: Phase, argv: list[str], name: str) -> list[dict[str, Any]]:
    path = run.work / f"{name}.json"
    code, out = run.run(phase, [*argv, "--out", str(path)])
    if code or not path.exists():
        raise RuntimeError(f"exit code {code}: {out[-800:]}")
    return json.loads(path.read_text())


def nvme_folder(run: Run) -> str:
    """The swap folder for NVMe offload, or '' (the reason kept) where it cannot run."""
    if not run.facts.get("async_io"):
        return ""
    free = shutil.disk_usage(run.work).free
    if free < NVME_MIN_FREE_BYTES:
        run.facts["nvme_reason"] = (
            f"{free / GiB:.0f} GiB free on {run.work}, under {NVME_MIN_FREE_BYTES / GiB:.0f} GiB"
        )
        return ""
    return str(run.work / "nvme")


def nvme_rows(run: Run, phase: Phase, argv: list[str], folder: str) -> list[dict[str, Any]]:
    """The NVMe candidate in a launch of its own, after the others are safe: a disk slower
    than the phase's limit costs this row, not the memory table."""
    nvme = ["--design", "none", "--extras", "nvme", "--nvme", folder]
    try:
        return memory_rows(run, phase, [*argv, *nvme], "memory-nvme")
    except OverTime as why:
        precision = run.settings.memory_precisions[0]
        return [
            {
                "label": f"z3 {precision} opt:nvme param:nvme",
                "design": False,
                "precision": precision,
                "offload_optimizer": "nvme",
                "offload_param": "nvme",
                "status": "timeout",
                "error": str(why),
                "predicted_bytes": 0,
            }
        ]


def phase_precision_offload(run: Run, phase: Phase) -> None:
    memory = run.phase("memory")
    rows = (memory.data.get("rows") if memory else None) or []
    if not rows:
        raise Skip("the memory phase measured nothing (its probes are this phase's)")
    reason = run.facts.get("nvme_reason") or "no NVMe candidate"
    phase.checks += precision_offload_checks(rows, "cuda" if run.cuda else "cpu", reason)
    phase.summary = "measured in the memory phase's launches"


# ---------------------------------------------------------------- studies


def cli(run: Run, *args: str) -> list[str]:
    return [run.python, "-m", "autotune.cli", *args]


def storage(run: Run) -> str:
    return f"sqlite:///{run.work / 'studies.db'}"


def status_doc(run: Run, phase: Phase, study: str) -> dict[str, Any]:
    argv = cli(run, "status", "--json", "--study", study, "--storage", storage(run))
    code, out = run.run(phase, argv, stdout_only=True)
    if code:
        raise RuntimeError(f"autotune status failed (exit code {code}): {out[-500:]}")
    return json.loads(out)


def rank_reports(status: dict[str, Any]) -> dict[int, dict[str, Any]]:
    reports = {}
    for trial in status.get("trials", []):
        path = Path(trial.get("trial_dir") or "/nonexistent") / "rank-0.json"
        if path.is_file():
            reports[trial["number"]] = json.loads(path.read_text())
    return reports


OOM_SPACE = """\
# The GPU check's out-of-memory study: ZeRO-0 next to ZeRO-2 with optimizer offload, smallest
# micro-batches first (grid order), under a limit the memory model places between them.
precision: [{precision}]
zero_stage: [0, 2]
offload_optimizer: [none, cpu]
offload_param: [none]
micro_batch_size: [1, 2]
gradient_accumulation_steps: [1, 2]
activation_checkpointing: [true]
"""


def phase_oom(run: Run, phase: Phase) -> None:
    if not run.cuda and not run.args.cpu_oom:
        raise Skip("needs CUDA (the CUDA out-of-memory path; --cpu-oom runs it on CPU ranks)")
    s = run.settings
    space = run.work / "oom_space.yaml"
    space.write_text(OOM_SPACE.format(precision=s.oom_precision))
    common = ["--workload", s.workload, "--gpus", "1", "--global-batch", "2", "--space", str(space)]
    argv = cli(run, "plan", *common, "--vram", "1TiB", "--all", "--json")
    code, out = run.run(phase, argv, stdout_only=True)
    if code:
        raise RuntimeError(f"autotune plan failed (exit code {code}): {out[-500:]}")
    plan = json.loads(out)
    memory = run.phase("memory")
    overheads = [
        r.get("overhead_bytes", 0) for r in (memory.data.get("rows", []) if memory else [])
    ]
    overhead = max(overheads, default=0) or (512 * MiB if run.cuda else 0)
    limit = oom_limit(plan, overhead)
    study = "gpu-check-oom"
    budget = max(20.0, min(s.oom_budget_s, phase.deadline - time.monotonic() - 40))
    argv = cli(run, "run", *common, "--vram", str(limit["limit_bytes"]), "--no-prune")
    argv += ["--sampler", "grid", "--no-confirm", "--budget", f"{budget:.0f}s", "--seed", "0"]
    argv += _run_flags(run, study)
    code, out = run.run(phase, argv, interrupt_first=True)
    status = status_doc(run, phase, study)
    leftovers = [f"{pid} {cmd}" for pid, cmd in run.leftovers()]
    phase.checks += oom_checks(
        status,
        plan,
        rank_reports(status),
        accelerator="cuda" if run.cuda else "cpu",
        exit_code=code,
        leftovers=leftovers,
    )
    phase.data = {"limit": limit, "study": study_summary(status), "run_tail": out[-1500:]}
    phase.summary = (
        f"limit {limit['limit_bytes'] / MiB:.0f} MiB: {limit['runs_out']} over it, "
        f"{limit['fits']} under"
    )


def _run_flags(run: Run, study: str) -> list[str]:
    return [
        "--executor",
        "local",
        "--quiet",
        "--study",
        study,
        "--storage",
        storage(run),
        "--trials-dir",
        str(run.work / "trials"),
    ]


DRY_RUN_SPACE = """\
# The GPU check's dry-run study: a small space whose probes are quick on two CPU cores (the
# default space's first probe, an offloading ZeRO-1 candidate, takes over a minute there).
precision: [fp32]
zero_stage: [0, 1]
offload_optimizer: [none]
offload_param: [none]
micro_batch_size: [8, 16]
activation_checkpointing: [false]
"""


def study_phase(
    run: Run, phase: Phase, workload: str, global_batch: int, budget: float, space: str = ""
) -> None:
    """autotune run on ``workload`` for ``budget`` seconds, then its status and export."""
    study = f"gpu-check-{workload}"
    argv = cli(
        run, "run", "--workload", workload, "--gpus", "1", "--global-batch", str(global_batch)
    )
    argv += ["--space", space] * bool(space)
    argv += ["--budget", f"{budget:.0f}s", "--seed", "0", *_run_flags(run, study)]
    if run.settings.study_max_trials:
        argv += ["--max-trials", str(run.settings.study_max_trials)]
    argv += ["--no-confirm"] * (not run.settings.study_confirms)
    code, out = run.run(phase, argv, interrupt_first=True)
    status = status_doc(run, phase, study)
    export = run.work / "trials" / study / "best"
    exported = (export / "ds_config.json").is_file()
    summary = study_summary(status)
    phase.data = {
        "workload": workload,
        "budget_s": budget,
        "study": summary,
        "run_tail": out[-3000:],
    }
    settings = run.settings
    phase.checks += study_checks(
        status, code, exported, min_probes=settings.min_probes, confirm=settings.study_confirms
    )
    best = summary.get("best") or {}
    phase.summary = (
        f"budget {budget:.0f} s; best {best.get('label')} at "
        f"{best.get('samples_per_s') or 0:.1f} samples/s"
    )
    if exported and best:
        trial = next((t for t in status["trials"] if t["number"] == best["trial"]), {})
        run.facts.setdefault("exports", {})[phase.name] = {
            "folder": str(export),
            "workload": workload,
            "checkpointing": bool(trial.get("candidate", {}).get("activation_checkpointing")),
            "samples_per_s": best.get("samples_per_s"),
        }


def phase_study(run: Run, phase: Phase) -> None:
    s = run.settings
    train_reserve = 0 if s.dry_run else s.timeouts["train_export"] + 10
    budget = min(
        s.study_budget_max_s, phase.deadline - time.monotonic() - train_reserve - s.study_overhead_s
    )
    if budget < s.study_budget_min_s:
        raise Skip(f"{budget:.0f} s left for its budget, under {s.study_budget_min_s:.0f} s")
    phase.deadline = min(phase.deadline, time.monotonic() + budget + s.study_overhead_s)
    phase.timeout_s = budget + s.study_overhead_s
    space = ""  # the default space on a GPU
    if s.dry_run:
        space = str(run.work / "dry_run_space.yaml")
        Path(space).write_text(DRY_RUN_SPACE)
    study_phase(run, phase, s.workload, s.global_batch, budget, space)


def phase_train_export(run: Run, phase: Phase) -> None:
    export = run.facts.get("exports", {}).get("study")
    if not export:
        raise Skip("the study phase exported nothing")
    argv = ["bash", str(Path(export["folder"]) / "launch.sh"), TRAIN]
    argv += ["--workload", export["workload"], "--steps", str(run.settings.train_steps)]
    argv += ["--checkpointing"] * export["checkpointing"]
    # launch.sh runs in the check's environment (its PATH: deepspeed, torchrun). On a GPU
    # its ops are built as in production: DeepSpeed's flags, in a fresh folder (autotune
    # builds its own without debug information, in a folder of its own). A dry run loads
    # autotune's, already built: two CPU cores compile nothing again.
    # On a GPU node its default launcher (deepspeed); in a dry run torchrun, whose
    # --standalone takes a free port where the deepspeed launcher's fixed 29500 may be busy
    launcher = "torchrun" if run.settings.dry_run else "deepspeed"
    env = {**run.env, "LAUNCHER": launcher}
    if run.settings.dry_run:
        argv.append("--autotune-ops")
    else:
        env["TORCH_EXTENSIONS_DIR"] = str(run.work / "torch_extensions_production")
    code, out = run.run(phase, argv, env=env)
    checks, data = train_checks(out, code, run.settings.train_steps)
    phase.checks += checks
    if data.get("samples_per_s") and export.get("samples_per_s"):
        data["vs_study"] = data["samples_per_s"] / export["samples_per_s"]
    phase.data = {**data, "launcher": launcher, "tail": out[-1500:]}
    phase.summary = f"{data.get('global_steps')} steps, {data.get('samples_per_s')} samples/s"


def phase_study_dit(run: Run, phase: Phase) -> None:
    if run.settings.dry_run:
        raise Skip("dry run: the DiT study runs on a GPU only")
    names = run.facts.get("dit_workloads") or []
    if not names:
        raise Skip("no dit-* workload in autotune.workloads")
    workload = next((n for n in DIT_PREFERRED if n in names), names[0])
    budget = min(90.0, phase.deadline - time.monotonic() - run.settings.study_overhead_s)
    if budget < run.settings.study_budget_min_s:
        raise Skip(
            f"{budget:.0f} s left for its budget, under {run.settings.study_budget_min_s:.0f} s"
        )
    study_phase(run, phase, workload, 64, budget)


# ---------------------------------------------------------------- gpu tests


def phase_gpu_tests(run: Run, phase: Phase) -> None:
    tests = "tests/test_gpu_paths.py"
    base = [run.python, "-m", "pytest", "-m", "gpu", tests, "-p", "no:cacheprovider"]
    if not run.cuda:
        code, out = run.run(phase, [*base, "--collect-only", "-q"])
        collected = [line for line in out.splitlines() if "::" in line]
        if code not in (0, 5) or not collected:
            raise RuntimeError(f"the gpu tests do not collect: {out[-600:]}")
        raise Skip(f"needs CUDA ({len(collected)} gpu tests collected; they skip without a GPU)")
    try:
        code, out = run.run(phase, [*base, "-v", "-rA"])
    except OverTime as over:
        # the tests that finished before the limit keep their outcomes (-v prints each)
        phase.data = {"outcomes": pytest_outcomes(over.output), "tail": over.output[-2500:]}
        raise
    outcomes = pytest_outcomes(out)
    phase.data = {"outcomes": outcomes, "tail": out[-2500:]}
    phase.checks += gpu_tests_checks(outcomes, code)
    phase.summary = ", ".join(
        f"{o} {sum(v == o for v in outcomes.values())}" for o in sorted(set(outcomes.values()))
    )


# ---------------------------------------------------------------- output files


def collect_logs(folder: Path, target: Path, keep_bytes: int = 400_000) -> None:
    """Every phase's log in one file, each cut to its last ``keep_bytes``."""
    with open(target, "w", encoding="utf-8") as out:
        for log in sorted(folder.glob("*.log")) if folder.is_dir() else []:
            text = log.read_bytes()[-keep_bytes:].decode(errors="replace")
            out.write(f"\n===== {log.name} =====\n{text}")


def archive_trials(work: Path, target: Path, max_file_bytes: int = 2_000_000) -> None:
    """The studies' database, trial folders and the memory probes' reports, small files only
    (no swap or op build files)."""

    def keep(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        return None if info.isfile() and info.size > max_file_bytes else info

    with tarfile.open(target, "w:gz") as tar:
        names = ("studies.db", "trials", "memory", "memory.json", "memory-nvme.json")
        for name in (*names, "oom_space.yaml"):
            path = work / name
            if path.exists():
                tar.add(path, arcname=name, filter=keep)


PHASES: list[tuple[str, Callable[[Run, Phase], None]]] = [
    ("install", phase_install),
    ("env", phase_env),
    ("ops", phase_ops),
    ("memory", phase_memory),
    ("precision_offload", phase_precision_offload),
    ("gpu_tests", phase_gpu_tests),
    ("oom", phase_oom),
    ("study", phase_study),
    ("train_export", phase_train_export),
    ("study_dit", phase_study_dit),
]
