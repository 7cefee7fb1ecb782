"""Where probes run: process groups launched cold or served by warm workers, on local
slots or Ray actors, and on a Ray cluster with probes that span nodes."""

from autotune.execution._cluster import check_ray_address, cluster_hardware
from autotune.execution._executor import Executor, make_executor
from autotune.execution.launch import (
    ProbeJob,
    kill_all_groups,
    launch_probes,
    read_reports,
)
from autotune.execution.loopback_cluster import LoopbackCluster

__all__ = [
    "Executor",
    "LoopbackCluster",
    "ProbeJob",
    "check_ray_address",
    "cluster_hardware",
    "kill_all_groups",
    "launch_probes",
    "make_executor",
    "read_reports",
]
