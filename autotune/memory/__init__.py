"""The memory model: ZeRO model states, traced activations, DeepSpeed's buffers, a
script's memory learned from its probes, the memory screen that rules out what cannot fit
before any probe, and every candidate's predicted memory on planned GPUs."""

from autotune.memory._memory_screen import Limits, MemoryScreen, Monotonicity, shape_key
from autotune.memory._planned_gpus import Planned, PlannedRow, plan_candidates
from autotune.memory.activations import profile
from autotune.memory.memory_model import MemoryModel, largest_layer_params, model_facts
from autotune.memory.script_memory import ScriptMemoryModel, read_probe

__all__ = [
    "Limits",
    "MemoryModel",
    "MemoryScreen",
    "Monotonicity",
    "Planned",
    "PlannedRow",
    "ScriptMemoryModel",
    "largest_layer_params",
    "model_facts",
    "plan_candidates",
    "profile",
    "read_probe",
    "shape_key",
]
