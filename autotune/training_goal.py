"""What a training run must achieve beyond speed: its size, its price, its deadline, and the
objective that ranks configurations by them (``autotune run --objective``, ``autotune plan
--study S --gpus N``).

- ``throughput`` (the default): the most samples per second.
- ``cost``: the least money per sample, ``price x GPUs / throughput`` (per GPU-hour); with a
  size (``--train-tokens`` or ``--train-samples``), the cost of the whole training run.
- ``deadline``: the cheapest configuration whose time to train, ``size / throughput``, ends
  within the deadline; when none does, the fastest, said in one line. Without a price, the
  cheapest is the one with the fewest GPU-hours.

Every value here is arithmetic on a throughput (measured or predicted) and what the user
gives; nothing is measured. At one world size every objective ranks configurations as
throughput does (the price and the GPUs are one factor for all); across world sizes
(``--gpus 1-8``) they part: :meth:`TrainingGoal.score` is the one ranking the sampler, the
confirmation round and the decision of the best share. A study keeps its goal in the user
attr :data:`GOAL_ATTR`, read and written only here (:func:`store`, :func:`of_study`).
"""

from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from autotune.errors import SettingsError
from autotune.flag import Flag
from autotune.units import COUNT, DURATION, TEXT, format_duration

if TYPE_CHECKING:
    import optuna

GOAL_ATTR = "autotune_goal"


class Objective(str, Enum):
    """What ranks configurations (``--objective``); stored and printed as its value. Only
    :class:`TrainingGoal` ranks by it: code elsewhere asks the goal, never the name."""

    THROUGHPUT = "throughput"
    COST = "cost"
    DEADLINE = "deadline"

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


OBJECTIVES: tuple[str, ...] = tuple(o.value for o in Objective)


class TrainingGoal(BaseModel):
    """The objective and what it needs, checked together (:meth:`of`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    objective: Annotated[Objective, Flag(unit=TEXT)] = Field(
        default=Objective.THROUGHPUT,
        description="What ranks configurations: throughput (samples/s), cost (the least per "
        "sample: needs --gpu-hour-price) or deadline (the cheapest that trains --train-tokens "
        "or --train-samples within --deadline, else the fastest); they differ across world "
        "sizes (--gpus 1-8).",
    )
    gpu_hour_price_usd: Annotated[float | None, Flag("gpu_hour_price")] = Field(
        default=None, gt=0, description="USD for one GPU for an hour (cost and time to train)."
    )
    train_samples: Annotated[float | None, Flag(unit=COUNT)] = Field(
        default=None, gt=0, description="Samples of the production training run, e.g. 5M."
    )
    train_tokens: Annotated[float | None, Flag(unit=COUNT)] = Field(
        default=None,
        gt=0,
        description="Tokens of the production training run, e.g. 10B or 2.5e12.",
    )
    deadline_s: Annotated[float | None, Flag("deadline", DURATION)] = Field(
        default=None, gt=0, description="Wall time the production run may take, e.g. 3d or 36h."
    )
    tokens_per_sample: int = Field(
        default=1, gt=0, description="Tokens in one sample (the workload's sequence length)."
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
        if objective == Objective.COST and gpu_hour_price_usd is None:
            raise SettingsError(
                "--objective cost needs --gpu-hour-price USD (the price of one GPU for an hour)"
            )
        if objective == Objective.DEADLINE and (deadline_s is None or not sized):
            missing = " and ".join(
                flag
                for flag, absent in (
                    ("--deadline D (e.g. 3d)", deadline_s is None),
                    ("--train-tokens N or --train-samples N", not sized),
                )
                if absent
            )
            raise SettingsError(f"--objective deadline needs {missing}")
        if deadline_s is not None and objective != Objective.DEADLINE:
            raise SettingsError(
                f"--deadline with --objective {objective}: a deadline ranks configurations "
                "only under --objective deadline; add it or leave --deadline out"
            )
        return cls(
            objective=Objective(objective),
            gpu_hour_price_usd=gpu_hour_price_usd,
            train_samples=train_samples,
            train_tokens=train_tokens,
            deadline_s=deadline_s,
        )

    def time_to_train_s(
        self, samples_per_s: float, tokens_per_sample: int | None = None
    ) -> float | None:
        """Seconds to process the run's size at ``samples_per_s`` (None: no size given);
        ``tokens_per_sample`` defaults to the goal's own."""
        if samples_per_s <= 0:
            return None
        if self.train_samples is not None:
            return self.train_samples / samples_per_s
        if self.train_tokens is not None:
            tokens = tokens_per_sample or self.tokens_per_sample
            return self.train_tokens / (samples_per_s * max(tokens, 1))
        return None

    def tier(self, samples_per_s: float) -> int:
        """1 for a configuration that finishes within the deadline, 0 otherwise (and for
        every configuration without a deadline objective)."""
        return self.tier_of(self.finishes(self.time_to_train_s(samples_per_s)))

    def tier_of(self, finishes: bool | None) -> int:
        """:meth:`tier` of a configuration that ``finishes`` within the deadline or not."""
        return int(bool(finishes)) if self.objective is Objective.DEADLINE else 0

    def factor(self, gpus: int, tier: int) -> float:
        """What a samples/s is multiplied by to compare within ``tier``: 1 (throughput, and
        deadline's configurations that do not finish: the fastest of them), else 1 / GPUs
        (samples per GPU-second: the cheapest, whatever the price)."""
        if self.objective is Objective.COST or (self.objective is Objective.DEADLINE and tier):
            return 1.0 / max(gpus, 1)
        return 1.0

    def score(self, samples_per_s: float, gpus: int) -> tuple[int, float]:
        """The objective's ranking, higher better: ``(tier, value)`` (:meth:`tier`,
        :meth:`factor`)."""
        tier = self.tier(samples_per_s)
        return tier, samples_per_s * self.factor(gpus, tier)

    def rate_to_match(self, score: tuple[int, float], gpus: int) -> float:
        """The least samples/s on ``gpus`` that scores at least ``score`` (:meth:`score`):
        what a probe must reach to be worth finishing (the search's early stop)."""
        tier, value = score
        if self.objective is Objective.THROUGHPUT:
            return value
        if self.objective is Objective.COST:
            return value * gpus
        required = self.required_samples_per_s() or 0.0
        if tier == 1:
            return max(value * gpus, required)
        return min(value, required) if required else value

    def ranks_like(self, other: TrainingGoal) -> bool:
        """Both rank every configuration alike (a price changes no order)."""
        if self.objective is not other.objective:
            return False
        if self.objective is not Objective.DEADLINE:
            return True
        return self.required_samples_per_s() == other.required_samples_per_s()

    def required_samples_per_s(self) -> float | None:
        """The samples/s that finishes the run's size within the deadline."""
        if self.deadline_s is None:
            return None
        if self.train_samples is not None:
            return self.train_samples / self.deadline_s
        if self.train_tokens is not None:
            return self.train_tokens / self.tokens_per_sample / self.deadline_s
        return None

    def noun(self, samples_per_s: float) -> str:
        """What the best at ``samples_per_s`` is called under this objective: "fastest",
        "cheapest", "cheapest within the deadline", or where it does not finish (then none
        does) "fastest (none finishes within the deadline)"."""
        if self.objective is Objective.COST:
            return "cheapest"
        if self.objective is Objective.DEADLINE and self.tier(samples_per_s) == 1:
            return "cheapest within the deadline"
        if self.objective is Objective.DEADLINE:
            return "fastest (none finishes within the deadline)"
        return "fastest"

    @property
    def ranks_by_speed_alone(self) -> bool:
        """The objective is throughput: samples/s alone ranks configurations."""
        return self.objective is Objective.THROUGHPUT

    @property
    def says_more_than_speed(self) -> bool:
        """The goal has something to show beside samples/s: another objective, a size or a
        price."""
        return not self.ranks_by_speed_alone or self.sized_or_priced

    def misses_deadline(self, samples_per_s: float) -> bool:
        """Under a deadline, ``samples_per_s`` does not finish within it."""
        return self.objective is Objective.DEADLINE and self.tier(samples_per_s) == 0

    def describe(self) -> str:
        """The objective and its inputs in one line: "cost at $2.50 per GPU-hour"."""
        parts = [self.objective.value]
        if self.gpu_hour_price_usd is not None:
            parts.append(f"at ${self.gpu_hour_price_usd:,.2f} per GPU-hour")
        if self.train_samples is not None:
            parts.append(f"for {self.train_samples:,.0f} samples")
        if self.train_tokens is not None:
            parts.append(f"for {self.train_tokens:,.0f} tokens")
        if self.deadline_s is not None:
            parts.append(f"within {format_duration(self.deadline_s)}")
        return " ".join(parts)

    @property
    def sized_or_priced(self) -> bool:
        """The goal gives a size or a price: there is a time or a cost to show."""
        return (
            self.gpu_hour_price_usd is not None
            or self.train_samples is not None
            or self.train_tokens is not None
        )

    def figures(self, samples_per_s: float, gpus: int) -> dict[str, float | bool | None]:
        """The time to train, cost and deadline verdict of ``samples_per_s`` on ``gpus``
        (each None where the goal does not give what it needs): ``--json``'s fields."""
        seconds = self.time_to_train_s(samples_per_s)
        return {
            "time_to_train_s": seconds,
            "cost_usd": self.cost_usd(gpus, seconds),
            "cost_per_million_samples_usd": self.cost_per_million_samples_usd(gpus, samples_per_s),
            "finishes_by_deadline": self.finishes(seconds),
        }

    def brief(self, samples_per_s: float, gpus: int) -> str:
        """:meth:`outcome` for a table cell: "72h $1,234", "$0.42/M samples"."""
        seconds = self.time_to_train_s(samples_per_s)
        cost = self.cost_usd(gpus, seconds)
        if seconds is None:
            per_million = self.cost_per_million_samples_usd(gpus, samples_per_s)
            return "" if per_million is None else f"${per_million:,.2f}/M samples"
        late = "" if self.finishes(seconds) in (None, True) else " late"
        return format_duration(seconds) + ("" if cost is None else f" ${cost:,.0f}") + late

    def outcome(self, samples_per_s: float, gpus: int) -> str:
        """What ``samples_per_s`` on ``gpus`` means for the run: its time to train, its cost
        and the deadline's verdict, or "" where the goal gives none of them."""
        seconds = self.time_to_train_s(samples_per_s)
        cost = self.cost_usd(gpus, seconds)
        if seconds is not None:
            text = f"trains in {format_duration(seconds)}"
            text += f" for ${cost:,.2f}" if cost is not None else ""
        else:
            per_million = self.cost_per_million_samples_usd(gpus, samples_per_s)
            text = "" if per_million is None else f"costs ${per_million:,.2f} per million samples"
        finishes = self.finishes(seconds)
        if finishes is not None:
            text += ", within the deadline" if finishes else ", past the deadline"
        return text

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


def store(study: optuna.Study, goal: TrainingGoal) -> None:
    """Keep the goal the study's last run ranked by (status, export and report read it)."""
    study.set_user_attr(GOAL_ATTR, goal.model_dump(mode="json"))


def of_study(study: optuna.Study) -> TrainingGoal:
    """The goal a study ranks by; throughput for a study that never stored one."""
    raw: Any = study.user_attrs.get(GOAL_ATTR)
    return TrainingGoal.model_validate(raw) if raw else TrainingGoal()
