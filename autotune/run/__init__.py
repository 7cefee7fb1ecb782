"""One tuning run: planning (settings resolved against hardware, workload and space), the
driver's hold on its study, the search loop (ask, screen, dispatch, record), autotune's
sampler and cost model, the budget clock and the confirmation rounds."""

from autotune.run._driver_session import continue_command
from autotune.run._resolved_run import (
    ResolvedRun,
    bind_space,
    check_nvme_path,
    resolve_run,
    workload_space,
)
from autotune.run._tuner import RunSummary, Tuner
from autotune.run.budget import ReservePolicy, SearchState, read_budget
from autotune.run.cost_model import (
    CostModel,
    WorkloadFacts,
    compute_scale_from,
    measure_cpu_matmul_flops,
)
from autotune.run.sampler import CandidatePolicy, History

__all__ = [
    "CandidatePolicy",
    "CostModel",
    "History",
    "ReservePolicy",
    "ResolvedRun",
    "RunSummary",
    "SearchState",
    "Tuner",
    "WorkloadFacts",
    "bind_space",
    "check_nvme_path",
    "compute_scale_from",
    "continue_command",
    "measure_cpu_matmul_flops",
    "read_budget",
    "resolve_run",
    "workload_space",
]
