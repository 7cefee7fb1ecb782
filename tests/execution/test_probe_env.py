"""The environment a probe's ranks get (cold launches, warm workers and Ray rank actors all
make it with ``probe_env``): the study's TF32 choice set explicitly, never inherited."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune.execution.launch import ProbeJob, group_shape, probe_env
from tests.support.probe_jobs import make_job

OVERRIDE = "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE"


def job_with(tmp_path: Path, precision: str) -> ProbeJob:
    job = make_job(tmp_path)
    return job.model_copy(
        update={"spec": job.spec.model_copy(update={"float32_matmul_precision": precision})}
    )


@pytest.mark.parametrize("parent", ["1", "0", None])
@pytest.mark.parametrize(("precision", "override"), [("highest", "0"), ("high", "1")])
def test_the_tf32_override_is_the_studys_whatever_the_parent_exports(
    tmp_path, monkeypatch, parent, precision, override
) -> None:
    """NGC's PyTorch containers export TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1, which makes cuBLAS
    use TF32 whatever the probe sets: a probe without --tf32 gets 0, explicitly (unset would
    not undo a 1 exported further up), one with --tf32 gets 1."""
    if parent is None:
        monkeypatch.delenv(OVERRIDE, raising=False)
    else:
        monkeypatch.setenv(OVERRIDE, parent)
    env = probe_env(job_with(tmp_path, precision), None)
    assert env[OVERRIDE] == override


def test_jobs_of_other_numerics_do_not_share_a_group(tmp_path) -> None:
    """The override is read once per process: a warm group, or one launch, serves only jobs
    whose environment it was started with."""
    assert group_shape(job_with(tmp_path, "highest")) != group_shape(job_with(tmp_path, "high"))
    assert group_shape(job_with(tmp_path, "high")) == group_shape(job_with(tmp_path, "high"))
