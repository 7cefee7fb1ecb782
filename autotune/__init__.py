"""autotune: find the fastest DeepSpeed configuration that fits a memory limit, by search.

The public API is named here; importing it does not import torch, deepspeed or ray.
"""

from autotune.candidate import Candidate
from autotune.errors import AutotuneError
from autotune.protocol import ProbeResult, ProbeSpec
from autotune.settings import RunSettings
from autotune.space import BoundSpace, SpaceSpec, load_space

__all__ = [
    "AutotuneError",
    "BoundSpace",
    "Candidate",
    "ProbeResult",
    "ProbeSpec",
    "RunSettings",
    "SpaceSpec",
    "load_space",
]
__version__ = "0.1.0"
