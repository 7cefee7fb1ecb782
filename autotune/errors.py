"""The one exception family of autotune.

Every user-fixable problem raises a subclass of :class:`AutotuneError` whose message says
what was wrong, what was received and how to fix it. Only the CLI catches these (it prints
the message on one line and exits with code 2); library callers may catch them too.
"""

from __future__ import annotations


class AutotuneError(Exception):
    """Base class: a problem the user can fix; its message is one actionable line."""

    exit_code = 2


class SettingsError(AutotuneError):
    """A flag or setting has a wrong value (budget, size, GPU count, ...)."""


class SpaceError(AutotuneError):
    """A search-space YAML file is missing, malformed or leaves no valid candidate."""


class WorkloadError(AutotuneError):
    """A workload name is unknown or a user workload does not import or build."""


class HardwareError(AutotuneError):
    """The machine cannot provide what the run asks for (devices, precision)."""


class StorageError(AutotuneError):
    """The Optuna storage is unreachable, locked or holds an incompatible study."""


class ExportError(AutotuneError):
    """No trial can be exported, or the exported config is rejected by DeepSpeed."""


class ExecutorError(AutotuneError):
    """Probes cannot be launched (Ray does not start, torchrun missing, ...)."""


class NoResultError(AutotuneError):
    """A run ended without a configuration to export (no probe fitted, or none ran)."""

    exit_code = 3
