"""The GPU check's set-up checks: the install, the driver's hardware detection, DeepSpeed's
ops, and the processes a phase leaves behind; and the facts of the set-up that are not
judged (which ops build here), for the phases after it.

Pure functions over data, standard library only (the check's driver imports this before
anything is installed); tests/benchmarks/test_gpu_check_doctored.py feeds each a doctored
input.
"""

from __future__ import annotations

from typing import Any

from .report import check

# what hardware detection may add to the device's used memory (nvidia-smi, MiB) and still
# hold no CUDA context: a context takes several hundred MiB on current drivers
DETECT_CONTEXT_MAX_MIB = 64


def install_checks(
    wheels: int, wheels_exit_code: int | None, import_exit_code: int, output: str
) -> list[dict[str, Any]]:
    """The carried wheels install (``wheels_exit_code`` None: none carried, a dry run),
    and autotune and its dependencies import in the check's venv."""
    checks = []
    if wheels_exit_code is not None:
        checks.append(
            check(
                "the carried wheels install",
                wheels_exit_code == 0 and wheels > 0,
                f"{wheels} wheels; pip exit code {wheels_exit_code}",
            )
        )
    checks.append(
        check(
            "autotune and its dependencies import",
            import_exit_code == 0,
            f"exit code {import_exit_code}" + (f": {output[-600:]}" if import_exit_code else ""),
        )
    )
    return checks


def env_checks(context_mib: float | None) -> list[dict[str, Any]]:
    """Hardware detection (which every ``autotune run`` does first) leaves no CUDA context
    in the driver process: it would count as overhead in every probe on the same GPU."""
    return [
        check(
            "the driver's hardware detection holds no CUDA context",
            None if context_mib is None else context_mib < DETECT_CONTEXT_MAX_MIB,
            "no nvidia-smi here"
            if context_mib is None
            else f"nvidia-smi memory.used grew {context_mib} MiB across autotune.hardware.detect() "
            f"(a context: over {DETECT_CONTEXT_MAX_MIB} MiB)",
        )
    ]


def ops_facts(build_exit_codes: dict[str, int], autotune_ops_output: str) -> dict[str, Any]:
    """What the ops phase found, not judged: whether FusedAdam builds (else every probe
    steps with torch's Adam, checked in the precision_offload phase) and whether async I/O
    does (else NVMe offload is not verified, with this reason)."""
    nvme_note = next(
        (
            line
            for line in autotune_ops_output.splitlines()
            if "NVMe offload is unavailable" in line
        ),
        "",
    )
    async_io = build_exit_codes.get("AsyncIOBuilder") == 0 and not nvme_note
    return {
        "fused_adam_builds": "FusedAdam does not build" not in autotune_ops_output,
        "async_io": async_io,
        "nvme_reason": nvme_note or ("" if async_io else "the async I/O op does not build"),
    }


def ops_checks(
    autotune_ops_exit_code: int, autotune_ops_output: str, build_exit_codes: dict[str, int]
) -> list[dict[str, Any]]:
    """``autotune build-ops`` passes and the CPU Adam (optimizer offload's) builds."""
    return [
        check(
            "autotune's op check passes",
            autotune_ops_exit_code == 0,
            autotune_ops_output.strip()[-300:],
        ),
        check(
            "CPU Adam builds",
            build_exit_codes.get("CPUAdamBuilder") == 0,
            f"exit codes {build_exit_codes}",
        ),
    ]


def leftover_check(leftovers: list[str]) -> dict[str, Any]:
    """No process the phase started still runs after it (each was killed, and named here)."""
    return check("no process left running", not leftovers, "; ".join(leftovers) or "none")
