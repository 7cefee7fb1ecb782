"""The search space: space files (YAML), their validity rules, the user's base config,
and the define-by-run suggestion of a :class:`~autotune.candidate.Candidate`."""

from autotune.space._base_config import (
    base_global_batch,
    check_conflicts,
    find_auto_values,
    load_base_config,
)
from autotune.space._dropped_backend import DroppedBackend
from autotune.space._space_file import load_space, parse_space
from autotune.space.search_space import BoundSpace, SpaceSpec

__all__ = [
    "BoundSpace",
    "DroppedBackend",
    "SpaceSpec",
    "base_global_batch",
    "check_conflicts",
    "find_auto_values",
    "load_base_config",
    "load_space",
    "parse_space",
]
