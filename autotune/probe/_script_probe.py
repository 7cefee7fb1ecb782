"""The probe of one run of the user's script in one rank: the patched
``deepspeed.initialize``, the engine's step clock, the memory counted and the report
(:class:`ScriptProbe`); how a rank runs it, cold or warm, is :mod:`autotune.probe.script_rank`.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from autotune import timing as steps
from autotune.probe._rank_memory import classify_failure
from autotune.probe._rank_process import (
    end_children,
    leave_now,
    leave_process_group,
    record_host_memory,
    record_peaks,
    write_report,
)
from autotune.probe._script_loss_run import ScriptLossRun
from autotune.protocol import (
    INITIALIZED_MARKER,
    SCRIPT_CONFIG_FILE,
    ModelInfo,
    ProbeSpec,
    RankReport,
)


class ProbeDone(BaseException):
    """A warm rank's probe has its steps: unwind the script (the report is written)."""


class ScriptProbe:
    """This rank's probe of one script run: the patched initialize, the step clock, and
    the report."""

    def __init__(
        self, spec: ProbeSpec, spec_path: Path, started: float, *, warm: bool = False
    ) -> None:
        self.warm = warm  # a warm rank: finish unwinds the script instead of exiting
        assert spec.script is not None
        self.spec = spec
        self.script = spec.script
        self.spec_path = spec_path
        self.started = started
        self.rank = int(os.environ.get("RANK", "0"))
        self.report = RankReport(rank=self.rank, status="ok", pid=os.getpid())
        self.device: Any = None
        self.tracker: Any = contextlib.nullcontext()
        self.tracking = False
        self.cuda: Any = None  # the CUDA limit (_cuda_memory.CudaMemoryLimit)
        self.engine: Any = None
        self.warmup_skipped: list[bool] = []
        self.timed_skipped = 0
        self.timing = False
        self.last_s = 0.0
        self.first_forward = True
        self._forward_start: int | None = None
        # a loss run (autotune verify) records losses instead of timing steps
        self.loss_run = (
            ScriptLossRun(spec.loss_run, spec.candidate.micro_batch_size)
            if spec.loss_run is not None
            else None
        )

    # -- deepspeed.initialize ---------------------------------------------------------------
    def install(self) -> None:
        """Replace ``deepspeed.initialize`` for the script (and what it imports)."""
        import deepspeed

        original = deepspeed.initialize
        self._original_initialize = original
        signature = inspect.signature(original)

        def initialize(*args: Any, **kwargs: Any) -> Any:
            if self.engine is not None:  # a second engine (evaluation ...): not probed
                return original(*args, **kwargs)
            bound = signature.bind_partial(*args, **kwargs)
            return self._initialize(original, dict(bound.arguments))

        deepspeed.initialize = initialize

    def _initialize(self, original: Any, arguments: dict[str, Any]) -> Any:
        model = arguments.get("model")
        arguments["config"] = self.config_for(self._passed_config(arguments), model)
        arguments.pop("config_params", None)
        Path(self.spec_path.parent, INITIALIZED_MARKER.format(rank=self.rank)).touch()
        if model is not None:
            self.report.model = ModelInfo.of(model)
            if self.loss_run is not None:
                from autotune.backends import get_backend

                backend = get_backend(self.spec.candidate.backend)
                self.loss_run.model_handed_over(model, backend)
        self._start_tracking(model)
        engine, *rest = original(**arguments)
        self.report.init_s = time.perf_counter() - self.started
        self.engine = engine
        self._attach(engine)
        self.last_s = time.perf_counter()
        return (engine, *rest)

    @staticmethod
    def _passed_config(arguments: dict[str, Any]) -> dict[str, Any]:
        """The config the script passed, as a dict (DeepSpeed's own loader reads paths and
        base64); ``args.deepspeed_config`` is taken over, so DeepSpeed sees one config."""
        from deepspeed.runtime.tensor_parallel.init_utils import load_ds_config

        passed = arguments.get("config")
        if passed is None:
            passed = arguments.get("config_params")
        ds_args = arguments.get("args")
        if passed is None and getattr(ds_args, "deepspeed_config", None) is not None:
            passed = ds_args.deepspeed_config
            arguments["args"] = copy.copy(ds_args)
            arguments["args"].deepspeed_config = None
        return copy.deepcopy(load_ds_config(passed)) if passed is not None else {}

    def config_for(self, base: dict[str, Any], model: Any) -> dict[str, Any]:
        """The candidate's tuned keys over the config the script passed."""
        largest = ModelInfo.of(model).largest_param if model is not None else None
        from autotune.backends import get_backend

        backend = get_backend(self.spec.candidate.backend)
        config = backend.render_config(
            self.spec.candidate, base, nvme_path=self.script.nvme_path, largest_param_numel=largest
        )
        if self.script.torch_adam:
            config = backend.with_fallback_optimizer(config)
        if self.rank == 0:
            _write_json(self.spec_path.parent / "engine_config.json", config)
            _write_json(self.spec_path.parent / SCRIPT_CONFIG_FILE, base)
        return config

    def start_cuda_memory(self) -> None:
        """CUDA: the limit and the peak statistics from the rank's start, before the script
        runs, so that what it puts on the device before ``deepspeed.initialize`` (a model
        built on the device, its data) is limited and counted. No process group exists yet:
        the limit covers the CUDA context and cuBLAS, and is set again at ``initialize``."""
        if self.device.type != "cuda":
            return
        import torch

        from autotune.probe import _cuda_memory as cuda_memory

        torch.cuda.reset_peak_memory_stats(self.device)
        self.cuda = cuda_memory.CudaMemoryLimit(self.spec, self.device)
        self.cuda.start()

    def _start_tracking(self, model: Any) -> None:
        """CPU: count tensor memory from here (the model's tensors held), under the limit.
        CUDA: the limit set again, now that the script's process group may exist (its
        communicator is then outside the allocator too); the peak counts from the start."""
        if self.device.type == "cuda":
            self.cuda.update(connect=True)
            return
        from autotune.probe._memtrack import TensorMemoryTracker

        self.tracker = TensorMemoryTracker(limit_bytes=self.spec.vram_limit_bytes)
        if model is not None:
            held = [getattr(p, "ds_tensor", p) for p in model.parameters()]
            self.tracker.adopt([*held, *model.buffers()])
        self.tracker.__enter__()
        self.tracking = True

    def _stop_tracking(self) -> None:
        if self.tracking:
            self.tracker.__exit__(None, None, None)
            self.tracking = False

    # -- the engine's steps -----------------------------------------------------------------
    def _attach(self, engine: Any) -> None:
        original_step = engine.step

        def step(*args: Any, **kwargs: Any) -> Any:
            if not engine.is_gradient_accumulation_boundary():
                return original_step(*args, **kwargs)
            skipped_before = int(getattr(engine, "skipped_steps", 0))
            if self.loss_run is not None:
                self.loss_run.before_step(engine)
            result = original_step(*args, **kwargs)
            skipped = int(getattr(engine, "skipped_steps", 0)) > skipped_before
            self._optimizer_step_done(skipped)
            return result

        engine.step = step
        if self.loss_run is not None:
            self.loss_run.attach(engine)
        module = getattr(engine, "module", None)
        if module is not None and hasattr(module, "register_forward_hook"):
            module.register_forward_pre_hook(self._before_forward, with_kwargs=True)
            module.register_forward_hook(self._after_forward)

    def _before_forward(self, module: Any, args: Any, kwargs: Any) -> None:
        if self.first_forward:
            self.first_forward = False
            self._check_batch(args, kwargs)
        if self.loss_run is not None:
            self.loss_run.forward_inputs(args, kwargs)
        self._forward_start = self._held_bytes()

    def _after_forward(self, module: Any, args: Any, output: Any) -> None:
        held, start = self._held_bytes(), self._forward_start
        if held is not None and start is not None:
            self.report.activation_bytes = max(self.report.activation_bytes, held - start)

    def _held_bytes(self) -> int | None:
        """Tensor bytes held now, during warm-up: the CPU tracker's live bytes, or CUDA's
        allocated bytes (the allocator's own statistic, which the forward's saved tensors and
        output raise as the tracker's live bytes do on CPU). None while timing (CPU: the
        tracker is off; CUDA: warm-up's forwards are the measure, as on CPU)."""
        if self.tracking:
            return int(self.tracker.live_bytes)
        if self.device.type == "cuda" and not self.timing:
            import torch

            return int(torch.cuda.memory_allocated(self.device))
        return None

    def _check_batch(self, args: Any, kwargs: Any) -> None:
        """The first micro-batch must have the candidate's size: a script that sizes its
        batches itself (not from the config) would be timed at the wrong batch."""
        import torch

        first = next(
            (v for v in [*args, *kwargs.values()] if isinstance(v, torch.Tensor) and v.dim()),
            None,
        )
        micro_batch = self.spec.candidate.micro_batch_size
        if first is not None and micro_batch not in first.shape:
            raise BatchMismatch(
                f"the script's first micro-batch has shape {tuple(first.shape)}, but the "
                f"candidate's micro-batch is {micro_batch}: it does not size its batches from "
                "the config (engine.train_micro_batch_size_per_gpu()); map its batch flag, "
                "e.g. --script-arg micro_batch_size=--batch-size"
            )

    def _optimizer_step_done(self, skipped: bool) -> None:
        if self.cuda is not None and not self.steps_seen():
            # DeepSpeed's groups and ZeRO's collectives have connected in the first step
            self.cuda.update()
        if self.loss_run is not None:
            if self.loss_run.step_done(self.engine, skipped):
                self.report.loss_trace = self.loss_run.trace()
                self.finish()
            return
        elapsed, skipped = self._agreed(time.perf_counter() - self.last_s, skipped)
        spec, report = self.spec, self.report
        if not self.timing:
            report.warmup_step_times_s.append(elapsed)
            self.warmup_skipped.append(skipped)
            max_warmup = spec.max_warmup_steps or spec.warmup_steps
            if steps.warmup_done(
                report.warmup_step_times_s, self.warmup_skipped, spec.warmup_steps, max_warmup
            ):
                self._stop_tracking()  # timed steps run without the dispatch hook
                report.warmup_s = sum(report.warmup_step_times_s)
                self.timing = True
        elif skipped:
            self.timed_skipped += 1
        else:
            report.step_times_s.append(elapsed)
            samples = spec.candidate.train_batch_size
            if steps.clearly_slower(report.step_times_s, samples, spec.stop_below_samples_per_s):
                report.stopped_early = True
        if self.timing and (report.stopped_early or self._timed_enough()):
            self.finish()
        self.last_s = time.perf_counter()

    def _timed_enough(self) -> bool:
        spec = self.spec
        return steps.timing_done(
            self.report.step_times_s,
            self.timed_skipped,
            min_steps=spec.timed_steps,
            max_steps=spec.max_timed_steps or spec.timed_steps,
            target=spec.target_spread,
            max_s=spec.max_timed_s,
        )

    def _agreed(self, elapsed: float, skipped: bool) -> tuple[float, bool]:
        """The slowest rank's time and whether any rank's loss scaler skipped the step."""
        import torch
        import torch.distributed as dist

        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            elapsed = time.perf_counter() - self.last_s
        agreed = torch.tensor([elapsed, float(skipped)], device=self.device)
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(agreed, op=dist.ReduceOp.MAX)
        return float(agreed[0].item()), bool(agreed[1].item() > 0)

    def steps_seen(self) -> int:
        if self.loss_run is not None:
            return len(self.loss_run.losses)
        return len(self.report.warmup_step_times_s) + len(self.report.step_times_s)

    def steps_needed(self) -> int:
        """Optimizer steps the probe needs at least, as far as it knows now."""
        if self.loss_run is not None:
            return self.loss_run.loss_run.steps
        warmup = len(self.report.warmup_step_times_s) if self.timing else None
        if warmup is None:
            warmup = max(self.spec.warmup_steps, 2)
        return warmup + self.spec.timed_steps + self.timed_skipped

    # -- the end ----------------------------------------------------------------------------
    def finish(self) -> None:
        """The probe has its steps: report, leave the process group together, exit 0."""
        self._stop_tracking()
        report = self.report
        report.skipped_steps = sum(self.warmup_skipped) + self.timed_skipped
        record_peaks(report, self.tracker, self.device, self.cuda)
        record_host_memory(report)
        report.wall_s = time.perf_counter() - self.started
        write_report(report, self.spec_path.parent)
        sys.stdout.flush()
        sys.stderr.flush()
        if self.warm:
            raise ProbeDone
        leave_process_group()
        end_children()
        os._exit(0)

    def uninstall(self) -> None:
        """Give ``deepspeed.initialize`` back and drop the engine (a warm rank's next job
        installs its own)."""
        import deepspeed

        original = getattr(self, "_original_initialize", None)
        if original is not None:
            deepspeed.initialize = original
        if self.engine is not None and hasattr(self.engine, "destroy"):
            with contextlib.suppress(Exception):  # ZeRO-3's hooks and partitioned buffers
                self.engine.destroy()
        self.engine = None
        self.tracker = contextlib.nullcontext()

    def fail(self, exc: BaseException) -> None:
        """The script raised: report ``oom`` or ``error`` (with where in the script) and
        exit without tearing down collectives (torchrun stops the peers)."""
        self._stop_tracking()
        self.report.status, self.report.error = classify_failure(exc)
        if isinstance(exc, (BatchMismatch, ScriptMissing)):
            self.report.error = str(exc)
        elif self.report.status == "error":
            traceback.print_exc()
            self.report.error = self._where(exc, self.report.error)
        leave_now(self.report, self.spec_path, self.started)

    def _where(self, exc: BaseException, error: str) -> str:
        """``error`` with the script's innermost line that raised it."""
        frames = [
            f for f in traceback.extract_tb(exc.__traceback__) if f.filename == self.script.path
        ]
        if not frames:
            return f"{Path(self.script.path).name} raised {error}"
        frame = frames[-1]
        return f"{Path(self.script.path).name} line {frame.lineno} raised {error} (`{frame.line}`)"[
            :600
        ]

    def ended(self, code: int) -> None:
        """The script returned (or exited) before the probe had what it needs."""
        name = Path(self.script.path).name
        if self.engine is None:
            self.report.status = "error"
            self.report.error = (
                f"{name} ended without calling deepspeed.initialize; autotune probes the "
                "engine the script creates"
                if code == 0
                else f"{name} exited with code {code} before calling deepspeed.initialize"
                + (" (argparse's code: it refused its arguments)" if code == 2 else "")
            )
        elif (
            code == 0
            and self.loss_run is None
            and len(self.report.step_times_s) >= self.spec.timed_steps
        ):
            self.finish()  # a short script, but the probe has its timed steps
        else:
            self.report.status = "error"
            seen, needed = self.steps_seen(), self.steps_needed()
            fewer = "--steps" if self.loss_run is not None else "--warmup-steps/--timed-steps"
            self.report.error = (
                f"the script stopped after {seen} optimizer steps; the probe needs {needed}: "
                f"give it more data (or more steps), or fewer {fewer}"
                if code == 0
                else f"{name} exited with code {code} after {seen} optimizer steps"
            )
        self._stop_tracking()
        leave_now(self.report, self.spec_path, self.started)


class BatchMismatch(RuntimeError):
    """The script's micro-batch is not the candidate's."""


class ScriptMissing(FileNotFoundError):
    """The script is not at its path on this rank's node."""


def _write_json(path: Path, data: Any) -> None:
    import json

    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
