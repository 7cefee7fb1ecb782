"""The memory model: ZeRO model states, traced activations, DeepSpeed's buffers, a
script's memory learned from its probes, and the memory screen that rules out what
cannot fit before any probe."""

from autotune.memory._memory_screen import Limits, MemoryScreen, Monotonicity, shape_key
from autotune.memory.activations import profile
from autotune.memory.memory_model import MemoryModel, largest_layer_params, model_facts
from autotune.memory.script_memory import ScriptMemoryModel, read_probe

__all__ = [
    "Limits",
    "MemoryModel",
    "MemoryScreen",
    "Monotonicity",
    "ScriptMemoryModel",
    "largest_layer_params",
    "model_facts",
    "profile",
    "read_probe",
    "shape_key",
]
