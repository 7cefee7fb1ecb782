"""A loss run of the user's script (``ProbeSpec.loss_run`` with ``ProbeSpec.script``,
for ``autotune verify``): the script trains as it would, and the rank records what each
optimizer step trained on and the loss it stepped with (:class:`ScriptLossRun`).

What autotune sets, and what it cannot:

- **Seeds**: python's ``random``, numpy and torch are seeded before the script runs, so a
  script that seeds nothing itself still builds the same weights and draws the same
  shuffles in every run; a script that seeds itself does so after, as it would.
- **Weights**: the model the script hands to ``deepspeed.initialize`` is digested (fp32,
  name order; gathered where the script built it under ``zero.Init``). Runs whose digests
  differ did not start from the same weights, and the check says it cannot judge.
- **Samples**: each micro-batch's integer inputs (token ids, labels) are hashed per
  sample at the engine module's forward; each step's digest is over every rank's hashes,
  sorted, so two splits of the same global batch give the same digest. A script whose data
  order is not reproducible (a sampler seeded from the clock, workers that race) shows in
  the reference's repeat; one whose order depends on the micro-batch shows against the
  winner. Inputs with no integer tensor (images) are not compared: the repeat alone tells.
- **Dropout**: ``torch.nn`` dropout modules are switched off, as in built-in runs (their
  masks are drawn per micro-batch); functional dropout inside the script's own code
  cannot be reached.
- **Loss**: what the script hands to ``engine.backward``, as DeepSpeed steps with it:
  divided by the accumulation steps unless the script passes ``scale_wrt_gas=False`` (the
  Hugging Face Trainer, which normalises over the step's items itself), summed over the
  step's micro-batches and averaged over the ranks.
"""

from __future__ import annotations

import hashlib
from typing import Any

from autotune.probe._loss_run import (
    grad_norm,
    mean_over_ranks,
    module_grad_norm,
    seed_everything,
    sq_sum,
    switch_off_dropout,
    weights_digest,
)
from autotune.protocol import LossRun, LossTrace


class ScriptLossRun:
    """One rank's record of a script's loss run."""

    def __init__(self, loss_run: LossRun, micro_batch: int) -> None:
        self.loss_run = loss_run
        self.micro_batch = micro_batch
        self.losses: list[float] = []
        self.grad_norms: list[float | None] = []
        self.skipped: list[bool] = []
        self.sample_digests: list[str] | None = []
        self._step_loss = 0.0
        self._step_backwards = 0
        self._step_samples: list[str] = []
        self._own_norm: float | None = None
        self._weights_sha256 = ""
        self._weights_sq_sum = 0.0
        self._batch_statistics = False
        self._dropout_modules = 0
        self._clipping = 0.0

    def seed(self) -> None:
        """Seed before the script runs (module docstring, "Seeds")."""
        seed_everything(self.loss_run.seed)

    def model_handed_over(self, model: Any, backend: Any) -> None:
        """The model at ``deepspeed.initialize``: its weights digested, dropout off."""
        import torch

        with backend.whole_parameters(model):
            state = {
                name: value.detach().cpu().clone() for name, value in model.state_dict().items()
            }
        self._weights_sha256 = weights_digest(state)
        self._weights_sq_sum = sq_sum(state)
        self._batch_statistics = any(
            isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in model.modules()
        )
        self._dropout_modules = switch_off_dropout(model)

    def attach(self, engine: Any) -> None:
        """Record every loss the script hands to ``engine.backward``."""
        original = engine.backward
        self._clipping = float(engine.gradient_clipping() or 0.0)

        def backward(*args: Any, **kwargs: Any) -> Any:
            # DeepSpeedEngine.backward(loss, retain_graph=False, scale_wrt_gas=True); its
            # NVTX wrapper hides the signature
            loss = args[0] if args else kwargs["loss"]
            scaled = kwargs.get("scale_wrt_gas", args[2] if len(args) > 2 else True)
            value = float(loss.detach().float().item())
            self._step_loss += value / engine.gradient_accumulation_steps() if scaled else value
            self._step_backwards += 1
            return original(*args, **kwargs)

        engine.backward = backward

    def forward_inputs(self, args: Any, kwargs: Any) -> None:
        """Hash this micro-batch's samples (module docstring, "Samples")."""
        if self.sample_digests is None:
            return
        hashes = sample_hashes([*args, *(kwargs[k] for k in sorted(kwargs))], self.micro_batch)
        if hashes is None:
            self.sample_digests = None
        else:
            self._step_samples += hashes

    def before_step(self, engine: Any) -> None:
        """An optimizer step is about to run: the module's gradients as it finds them (the
        norm where DeepSpeed reports none, :func:`~autotune.probe._loss_run.grad_norm`)."""
        self._own_norm = module_grad_norm(engine.module)

    def step_done(self, engine: Any, skipped: bool) -> bool:
        """An optimizer step ended: record it (agreed over the ranks); whether the run has
        all its steps."""
        if self._step_backwards == 0:
            raise RuntimeError(
                "the script stepped without handing a loss to engine.backward (it calls "
                "loss.backward() itself?): the loss check compares the loss given to "
                "engine.backward"
            )
        loss, any_skipped = mean_over_ranks(self._step_loss, skipped, engine.device)
        self.losses.append(loss)
        self.skipped.append(any_skipped)
        self.grad_norms.append(grad_norm(engine, self._own_norm))
        if self.sample_digests is not None:
            self.sample_digests.append(_step_digest(self._step_samples))
        self._step_loss, self._step_backwards, self._step_samples = 0.0, 0, []
        return len(self.losses) >= self.loss_run.steps

    def trace(self) -> LossTrace:
        return LossTrace(
            losses=self.losses,
            grad_norms=self.grad_norms,
            skipped=self.skipped,
            initial_weights_sha256=self._weights_sha256,
            initial_weights_sq_sum=self._weights_sq_sum,
            loaded_weights_sq_sum=self._weights_sq_sum,
            batch_statistics=self._batch_statistics,
            gradient_clipping=self._clipping,
            dropout_modules=self._dropout_modules,
            sample_digests=self.sample_digests,
        )


def sample_hashes(inputs: list[Any], micro_batch: int) -> list[str] | None:
    """One hash per sample over the integer tensors of ``inputs`` whose first dimension is
    the micro-batch (None when there are none)."""
    import torch

    rows = [
        t.detach().cpu().contiguous()
        for t in inputs
        if isinstance(t, torch.Tensor)
        and t.dim() >= 1
        and t.shape[0] == micro_batch
        and not t.is_floating_point()
        and not t.is_complex()
    ]
    if not rows:
        return None
    hashes = []
    for index in range(micro_batch):
        digest = hashlib.sha256()
        for tensor in rows:
            digest.update(tensor[index].numpy().tobytes())
        hashes.append(digest.hexdigest())
    return hashes


def _step_digest(samples: list[str]) -> str:
    """The step's digest over every rank's sample hashes, sorted."""
    import torch.distributed as dist

    gathered: list[list[str]] = [samples]
    if dist.is_initialized() and dist.get_world_size() > 1:
        gathered = [[] for _ in range(dist.get_world_size())]
        dist.all_gather_object(gathered, samples)
    every = sorted(h for rank in gathered for h in rank)
    return hashlib.sha256("\n".join(every).encode()).hexdigest()
