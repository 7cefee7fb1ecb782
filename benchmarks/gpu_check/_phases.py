"""The GPU check's phases (its driver, _driver.py, runs them in this order, :data:`PHASES`).

Each phase gets the run and its own record; it runs commands through ``run.run`` (its time
limit applies), adds checks and data to the record, and raises ``Skip`` where it does not
apply here. This module holds the phases that set the check up (install, env, ops) and the
gpu tests; the memory phases are in _memory_phases.py, FSDP2's in _fsdp2_phase.py, the
studies in _study_phases.py, and what the commands measure is judged in the *_checks.py
modules.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time
from collections.abc import Callable
from pathlib import Path

from ._fsdp2_phase import phase_fsdp2
from ._memory_phases import phase_memory, phase_nvme, phase_precision_offload
from ._run import PROBES, REPO, OverTime, Phase, Run, Skip
from ._script_phases import script_study
from ._study_phases import phase_oom, phase_study, phase_study_dit, phase_train_export
from ._world_size_phase import phase_world_size
from .setup_checks import env_checks, install_checks, ops_checks, ops_facts
from .study_checks import gpu_tests_checks, pytest_outcomes

SMOKE = "import autotune.cli, autotune.probe, deepspeed, optuna, sqlalchemy, alembic, pydantic"
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
    wheels_code = None
    if wheels:
        wheels_code, out = run.run(phase, [*pip, "--ignore-installed", *map(str, wheels)])
        phase.data["wheels_output"] = out[-400:]
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
    phase.checks += install_checks(len(wheels), wheels_code, code, out)
    if code:
        run.facts["abort"] = "autotune does not import in the check's venv (install phase)"
    # a fact: the node's own image may hold conflicts that are none of the check's business
    code, out = run.run(phase, [run.python, "-m", "pip", "check"])
    phase.data["pip_check"] = {"exit_code": code, "output": out.strip()[-600:]}
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
        code = (
            "from autotune.backends.deepspeed import torch_extensions_dir; "
            "print(torch_extensions_dir())"
        )
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
        device_count=hardware.get("device_count"),
    )
    run.facts["versions"] = {key: facts.get(key) for key in VERSION_KEYS}
    nvcc = shutil.which("nvcc", path=run.env.get("PATH"))
    run.facts["nvcc"] = nvcc
    phase.data = facts
    phase.summary = (
        f"{run.facts['device']} ({hardware.get('accelerator')}); torch {facts.get('torch')}"
    )
    phase.checks += env_checks(facts.get("detect_context_mib"))
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
    code, out = run.run(phase, [run.python, "-m", "autotune.cli", "build-ops"])
    facts = ops_facts(codes, out)
    run.facts.update(facts, torch_adam=not facts["fused_adam_builds"])
    phase.data = {
        "build_exit_codes": codes,
        "autotune_ops": out.strip().splitlines()[-4:],
        **facts,
    }
    phase.checks += ops_checks(code, out, codes)
    fused = "yes" if facts["fused_adam_builds"] else "no (probes step with torch's Adam)"
    aio = "yes" if facts["async_io"] else f"no ({facts['nvme_reason']})"
    phase.summary = f"FusedAdam builds: {fused}; async I/O builds: {aio}"


# ---------------------------------------------------------------- gpu tests


# the gpu tests the GPU check runs within its time plan: those of the module fixture's
# launches (tests/integration/test_gpu_paths.py); the others are reported not verified
GPU_TESTS = "tests/integration/test_gpu_paths.py"
IN_PLAN_MARKER = "gpu_check_plan"


def collected(run: Run, phase: Phase, marks: str) -> list[str]:
    """The test ids pytest collects from the gpu tests under ``marks``."""
    argv = [run.python, "-m", "pytest", "-m", marks, GPU_TESTS, "-p", "no:cacheprovider"]
    code, out = run.run(phase, [*argv, "--collect-only", "-q"])
    if code not in (0, 5):
        raise RuntimeError(f"the gpu tests do not collect: {out[-600:]}")
    return [line.strip() for line in out.splitlines() if "::" in line]


def phase_gpu_tests(run: Run, phase: Phase) -> None:
    phase.outside_plan = [
        {"where": name, "reason": f"not verified, outside the plan (no {IN_PLAN_MARKER} marker)"}
        for name in collected(run, phase, f"gpu and not {IN_PLAN_MARKER}")
    ]
    if not run.cuda:
        planned = collected(run, phase, f"gpu and {IN_PLAN_MARKER}")
        if not planned:
            raise RuntimeError(f"no gpu test carries the {IN_PLAN_MARKER} marker")
        raise Skip(
            f"needs CUDA ({len(planned)} gpu tests in the plan collected, "
            f"{len(phase.outside_plan)} outside it; they skip without a GPU)"
        )
    argv = [run.python, "-m", "pytest", "-m", f"gpu and {IN_PLAN_MARKER}", GPU_TESTS]
    try:
        code, out = run.run(phase, [*argv, "-p", "no:cacheprovider", "-v", "-rA"])
    except OverTime as over:
        # the tests that finished before the limit keep their outcomes (-v prints each)
        phase.data = {"outcomes": pytest_outcomes(over.output), "tail": over.output[-2500:]}
        raise
    outcomes = pytest_outcomes(out)
    phase.data = {"outcomes": outcomes, "tail": out[-2500:]}
    phase.checks += gpu_tests_checks(outcomes, code)
    phase.summary = (
        ", ".join(
            f"{o} {sum(v == o for v in outcomes.values())}" for o in sorted(set(outcomes.values()))
        )
        + f"; {len(phase.outside_plan)} outside the plan"
    )


# in the order of what they prove: CUDA's memory truths (the peak, the overhead, the limit,
# an out-of-memory), FSDP2, precision and offload, the study and its export, the scripts;
# then what needs more than the budget gives (settings.BEYOND_BUDGET)
PHASES: list[tuple[str, Callable[[Run, Phase], None]]] = [
    ("install", phase_install),
    ("env", phase_env),
    ("ops", phase_ops),
    ("memory", phase_memory),
    ("gpu_tests", phase_gpu_tests),
    ("oom", phase_oom),
    ("fsdp2", phase_fsdp2),
    ("precision_offload", phase_precision_offload),
    ("study", phase_study),
    ("train_export", phase_train_export),
    ("script_deepspeed", script_study),
    ("script_trainer", script_study),
    ("study_dit", phase_study_dit),
    ("world_size", phase_world_size),
    ("nvme", phase_nvme),
]
