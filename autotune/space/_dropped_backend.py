"""A training backend a study's space lists but the study cannot train with here, and why
(its torch below the backend's floor; a ``--script`` study, which FSDP2 cannot probe).
Binding the space drops it (:meth:`autotune.space.SpaceSpec.bind`); the study keeps the
record (:mod:`autotune.study.storage`) and status, ``--json``, summary.md and report.html
show it."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class DroppedBackend(BaseModel):
    """One backend left out of a study's space."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    backend: str = Field(description="The backend's name, as the space lists it (fsdp2).")
    reason: str = Field(
        description="Why the study cannot train with it here, and what would bring it back."
    )

    @property
    def line(self) -> str:
        """The note every output shows: "backend fsdp2 dropped: ..."."""
        return f"backend {self.backend} dropped: {self.reason}"
