"""What a training run must achieve beyond speed: its size, its price, its deadline, and the
objective that ranks configurations by them (``autotune plan --study S --gpus N``).

- ``throughput`` (the default): the most samples per second.
- ``cost``: the least money per sample, ``price x GPUs / throughput`` (per GPU-hour); with a
  size (``--train-tokens`` or ``--train-samples``), the cost of the whole training run.
- ``deadline``: the cheapest configuration whose time to train, ``size / throughput``, ends
  within the deadline; when none does, the fastest, said in one line. Without a price, the
  cheapest is the one with the fewest GPU-hours.

Every value here is arithmetic on a throughput (measured or predicted) and what the user
gives; nothing is measured.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from autotune.errors import SettingsError

Objective = Literal["throughput", "cost", "deadline"]
OBJECTIVES: tuple[Objective, ...] = ("throughput", "cost", "deadline")


class TrainingGoal(BaseModel):
    """The objective and what it needs, checked together (:meth:`of`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    objective: Objective = Field(default="throughput", description="What ranks configurations.")
    gpu_hour_price_usd: float | None = Field(
        default=None, gt=0, description="Price of one GPU (or CPU rank) for an hour, in USD."
    )
    train_samples: float | None = Field(
        default=None, gt=0, description="Samples the training run processes."
    )
    train_tokens: float | None = Field(
        default=None, gt=0, description="Tokens the training run processes."
    )
    deadline_s: float | None = Field(
        default=None, gt=0, description="Wall time the training run may take, in seconds."
    )

    @classmethod
    def of(
        cls,
        objective: str,
        *,
        gpu_hour_price_usd: float | None = None,
        train_samples: float | None = None,
        train_tokens: float | None = None,
        deadline_s: float | None = None,
    ) -> TrainingGoal:
        """The goal, or one line saying which flag is missing or wrong."""
        if objective not in OBJECTIVES:
            raise SettingsError(f"--objective {objective}: choose one of {', '.join(OBJECTIVES)}")
        for flag, value in (
            ("--gpu-hour-price", gpu_hour_price_usd),
            ("--train-samples", train_samples),
            ("--train-tokens", train_tokens),
        ):
            if value is not None and not value > 0:
                raise SettingsError(f"{flag} {value:g}: give a positive number")
        if train_samples is not None and train_tokens is not None:
            raise SettingsError(
                "--train-samples and --train-tokens: give one size of the training run"
            )
        sized = train_samples is not None or train_tokens is not None
        if objective == "cost" and gpu_hour_price_usd is None:
            raise SettingsError(
                "--objective cost needs --gpu-hour-price USD (the price of one GPU for an hour)"
            )
        if objective == "deadline" and (deadline_s is None or not sized):
            missing = " and ".join(
                flag
                for flag, absent in (
                    ("--deadline D (e.g. 3d)", deadline_s is None),
                    ("--train-tokens N or --train-samples N", not sized),
                )
                if absent
            )
            raise SettingsError(f"--objective deadline needs {missing}")
        if deadline_s is not None and objective != "deadline":
            raise SettingsError(
                f"--deadline with --objective {objective}: a deadline ranks configurations "
                "only under --objective deadline; add it or leave --deadline out"
            )
        return cls(
            objective=objective,  # type: ignore[arg-type]
            gpu_hour_price_usd=gpu_hour_price_usd,
            train_samples=train_samples,
            train_tokens=train_tokens,
            deadline_s=deadline_s,
        )

    def time_to_train_s(self, samples_per_s: float, tokens_per_sample: int) -> float | None:
        """Seconds to process the run's size at ``samples_per_s`` (None: no size given)."""
        if samples_per_s <= 0:
            return None
        if self.train_samples is not None:
            return self.train_samples / samples_per_s
        if self.train_tokens is not None:
            return self.train_tokens / (samples_per_s * max(tokens_per_sample, 1))
        return None

    def cost_usd(self, gpus: int, seconds: float | None) -> float | None:
        """``price x GPUs x hours`` (None without a price or a time)."""
        if self.gpu_hour_price_usd is None or seconds is None:
            return None
        return self.gpu_hour_price_usd * gpus * seconds / 3600.0

    def cost_per_million_samples_usd(self, gpus: int, samples_per_s: float) -> float | None:
        """The price of a million samples at ``samples_per_s`` on ``gpus`` (None: no price)."""
        if samples_per_s <= 0:
            return None
        return self.cost_usd(gpus, 1e6 / samples_per_s)

    def finishes(self, seconds: float | None) -> bool | None:
        """Whether ``seconds`` ends within the deadline (None: no deadline or no time)."""
        if self.deadline_s is None or seconds is None:
            return None
        return seconds <= self.deadline_s


def parse_count(text: str, *, flag: str) -> float:
    """``"10e9"``, ``"10B"``, ``"500M"``, ``"2.5k"`` -> a positive count."""
    value = text.strip().upper().replace("_", "")
    scale = {"K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12}.get(value[-1:], 1.0)
    number = value[:-1] if scale != 1.0 else value
    try:
        count = float(number) * scale
    except ValueError:
        raise SettingsError(
            f"{flag}: cannot read {text!r}; give a count such as 10e9, 10B, 500M or 2.5k"
        ) from None
    if not count > 0:
        raise SettingsError(f"{flag} {text}: give a positive count")
    return count


def parse_world_sizes(text: str, *, flag: str = "--gpus") -> tuple[int, ...]:
    """``"8"`` -> (8,); ``"1-4"`` -> (1, 2, 3, 4); ``"2,4,8"`` -> (2, 4, 8); sorted."""
    sizes: set[int] = set()
    for part in text.replace(" ", "").split(","):
        low, dash, high = part.partition("-")
        try:
            first, last = int(low), int(high) if dash else int(low)
        except ValueError:
            raise SettingsError(
                f"{flag} {text}: give a number of GPUs (8), a range (1-8) or a list (2,4,8)"
            ) from None
        if first < 1 or last < first:
            raise SettingsError(
                f"{flag} {text}: {part} is not a positive count or an increasing range"
            )
        sizes.update(range(first, last + 1))
    return tuple(sorted(sizes))
