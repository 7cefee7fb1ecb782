"""The memory screen of a study after the fact (``autotune verify``, ``autotune plan
--study``): the memory model of its workload (or script) at its limit, taught by its probes,
so that the measurement wins over the model as in the search."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from autotune.study import records

if TYPE_CHECKING:
    from autotune.memory import MemoryScreen
    from autotune.study import StudyConfig, TrialView

MEMORY_MARGIN = 0.05  # the share of the limit a configuration must leave free, as the search's


def study_memory_screen(
    workload: Any,
    config: StudyConfig,
    trials: list[TrialView],
    *,
    host_ram_bytes: int,
    ranks_per_node: int,
    vram_limit_bytes: int | None = None,
) -> MemoryScreen:
    """The study's memory screen, with every probe of ``trials`` learned."""
    from autotune.memory import Limits, MemoryScreen

    screen = MemoryScreen(
        workload,
        Limits(
            accelerator=config.accelerator,  # type: ignore[arg-type]
            vram_limit_bytes=vram_limit_bytes or config.vram_limit_bytes,
            margin=MEMORY_MARGIN,
            host_ram_bytes=host_ram_bytes,
            ranks_per_node=ranks_per_node,
        ),
        base_config=config.base_config,
    )
    for trial in records.evaluations(trials):
        screen.learn(trial)
    return screen
