"""A tuner whose probes are scripted: a stand-in executor and the study it fills."""

from __future__ import annotations

import time

import optuna


def make_tuner(tmp_path, space_yaml: str | None = None, executor=None, **settings: object):
    """A Tuner on gpt-tiny with 2 ranks, its study in ``tmp_path``; ``space_yaml`` the text
    of its space file, ``executor`` the stand-in every probe goes to."""
    from autotune.run._resolved_run import resolve_run
    from autotune.run._tuner import Tuner
    from autotune.settings import RunSettings

    if space_yaml is not None:
        space = tmp_path / "space.yaml"
        space.write_text(space_yaml)
        settings["space"] = str(space)
    settings.setdefault("world_sizes", (2,))
    built = RunSettings.build(
        workload="gpt-tiny",
        trials_dir=tmp_path / "trials",
        storage_url=f"sqlite:///{tmp_path}/t.db",
        **settings,
    )
    factory = (lambda resolved: executor) if executor is not None else None
    return Tuner(resolve_run(built), executor_factory=factory)


def load_study(tmp_path) -> optuna.Study:
    return optuna.load_study(study_name="gpt-tiny", storage=f"sqlite:///{tmp_path}/t.db")


class ScriptedExecutor:
    """Stands in for the probes, by design: the decision logic under test needs chosen
    throughputs (a tie that persists), which real probes on a noisy machine cannot be made
    to produce on demand. Each probe of a label returns its next scripted samples/s."""

    capacity = 1

    def __init__(
        self, rates: dict[str, list[float]], seconds: dict[tuple[str, int], float] | None = None
    ) -> None:
        self.rates = {label: list(values) for label, values in rates.items()}
        # (label, n): the n-th probe of that label (from 1) takes this long in wall time
        self.seconds = dict(seconds or {})
        self.order: list[str] = []
        self.stop_below: list[float] = []  # each probe's early-stop threshold (0: none)
        self._done: list[tuple[int, object]] = []

    def submit(self, job) -> int:
        from autotune.protocol import ProbeResult

        label = job.spec.candidate.label
        self.order.append(label)
        time.sleep(self.seconds.get((label, self.order.count(label)), 0.0))
        self.stop_below.append(job.spec.stop_below_samples_per_s)
        values = self.rates[label]
        rate = values.pop(0) if len(values) > 1 else values[0]
        batch = job.spec.candidate.train_batch_size
        result = ProbeResult(
            status="ok",
            samples_per_s=rate,
            samples_per_s_min=rate,
            samples_per_s_max=rate,
            step_time_s=batch / rate,
            step_times_s=[batch / rate] * 3,
            peak_bytes_per_rank=[2**20, 2**20],
            wall_s=1.0,
        )
        self._done.append((len(self.order), result))
        return len(self.order)

    def wait(self, timeout_s: float):
        done, self._done = self._done, []
        return done

    def cancel_all(self) -> None: ...

    def close(self) -> None: ...


def example_script_run(
    tmp_path, monkeypatch, hardware=None, mappings: tuple[str, ...] = (), **settings: object
):
    """A run of ``examples/vision_deepspeed``'s unedited script on 2 ranks, resolved (its
    trials folder in ``tmp_path``); ``mappings`` its ``--script-arg`` values, ``settings``
    by their flat names."""
    from autotune.run import resolve_run
    from autotune.script_config import parse_script
    from autotune.settings import RunSettings
    from tests.support.paths import ROOT

    example = ROOT / "examples" / "vision_deepspeed"
    monkeypatch.chdir(example)
    script = parse_script(
        "train.py",
        ["--deepspeed", "--deepspeed_config", "ds_config.json"],
        list(mappings),
        cwd=example,
    )
    built = RunSettings.build(
        workload=f"script:{script.path}",
        script=script,
        world_sizes=(2,),
        trials_dir=tmp_path / "trials",
        **settings,
    )
    return resolve_run(built, hardware)
