"""Diffusion transformers (DiT, Peebles & Xie 2023, "Scalable Diffusion Models with
Transformers") built with `diffusers`' ``DiTTransformer2DModel`` (random init, no download).

Models are named as in the paper: S/B/L/XL (table 1: 12 layers x 384 / 6 heads, 12 x 768 /
12, 24 x 1024 / 16, 28 x 1152 / 16) at patch size 2, 4 or 8, on 256 px images, i.e. the
32 x 32 x 4 latents of the Stable Diffusion VAE, so a sample is (32 / p)^2 tokens. They are
class-conditional (ImageNet's 1000 classes) and learn the variance, so the model outputs
2 x 4 channels, as in diffusers' port of the released checkpoints (``facebook/DiT-XL-2-256``:
``out_channels`` 8, ``num_embeds_ada_norm`` 1000).

diffusers' port gives every block its own timestep and class embedding (the paper shares
one): DiT-XL/2 has 750M parameters here against the paper's 675M, and these are the weights
a diffusers user trains, so model states are counted on them.

The loss is DiT's training objective (``diffusion/gaussian_diffusion.py`` of
facebookresearch/DiT, from OpenAI's improved-diffusion): noise the latents at a random
timestep of the linear 1000-step schedule (beta 1e-4 to 0.02), predict the noise (MSE), and
train the learned variance through the variational bound with the predicted mean frozen
(Nichol & Dhariwal 2021, "Improved Denoising Diffusion Probabilistic Models", sec. 3.1).
"""

from __future__ import annotations

import copy
import math
from typing import TYPE_CHECKING, Any

from autotune.workloads.base import Workload

if TYPE_CHECKING:
    import torch

# The linear schedule of DiT (and DDPM): betas from 1e-4 to 0.02 over 1000 steps.
TIMESTEPS = 1000
BETA_START, BETA_END = 1e-4, 0.02

# (layers, hidden, heads) of the DiT paper's table 1.
DIT_SIZES = {"s": (12, 384, 6), "b": (12, 768, 12), "l": (24, 1024, 16), "xl": (28, 1152, 16)}
DIT_PATCHES = (2, 4, 8)


class DiTWorkload(Workload):
    """A class-conditional DiT trained with DiT's diffusion loss on synthetic latents."""

    def __init__(
        self,
        name: str,
        *,
        layers: int,
        hidden: int,
        heads: int,
        patch: int,
        latent_size: int = 32,
        latent_channels: int = 4,
        num_classes: int = 1000,
        learn_sigma: bool = True,
        default_global_batch: int = 256,
    ) -> None:
        if hidden % heads or latent_size % patch:
            raise ValueError(
                f"DiT {name}: hidden {hidden} must divide by heads {heads} and latent "
                f"{latent_size} by patch {patch}"
            )
        self.name = name
        self.layers = layers
        self.hidden = hidden
        self.heads = heads
        self.patch = patch
        self.latent_size = latent_size
        self.latent_channels = latent_channels
        self.num_classes = num_classes
        self.learn_sigma = learn_sigma
        self.default_global_batch = default_global_batch
        # DiT's tokens are the latent's patches
        self.tokens_per_sample = (latent_size // patch) ** 2

    def _identity(self) -> tuple[object, ...]:
        return tuple(sorted(vars(self).items()))

    def __eq__(self, other: object) -> bool:
        # Equal workloads share cached traces (the memory model builds variants by depth).
        return isinstance(other, DiTWorkload) and self._identity() == other._identity()

    def __hash__(self) -> int:
        return hash(self._identity())

    @property
    def num_layers(self) -> int:
        return self.layers

    def with_layers(self, layers: int) -> DiTWorkload:
        """The same model with ``layers`` blocks (the memory model traces two short stacks
        and extrapolates: every block holds the same activations)."""
        clone = copy.copy(self)
        clone.layers = layers
        return clone

    def import_model_code(self) -> None:
        from diffusers import DiTTransformer2DModel  # noqa: F401

    def build_model(self) -> torch.nn.Module:
        from diffusers import DiTTransformer2DModel
        from diffusers.utils import logging as diffusers_logging

        diffusers_logging.set_verbosity_error()
        channels = self.latent_channels
        return DiTTransformer2DModel(
            num_attention_heads=self.heads,
            attention_head_dim=self.hidden // self.heads,
            in_channels=channels,
            out_channels=2 * channels if self.learn_sigma else channels,
            num_layers=self.layers,
            sample_size=self.latent_size,
            patch_size=self.patch,
            num_embeds_ada_norm=self.num_classes,
        )

    def make_batch(
        self, micro_batch_size: int, device: torch.device, dtype: torch.dtype | None = None
    ) -> dict[str, Any]:
        """Clean latents, their noise, timesteps, labels, and the schedule's coefficients at
        each sample's timestep (fp32 whatever ``dtype``: the diffusion arithmetic stays in
        fp32 and :meth:`loss` casts what enters the model)."""
        import torch

        generator = torch.Generator().manual_seed(micro_batch_size)
        shape = (micro_batch_size, self.latent_channels, self.latent_size, self.latent_size)
        batch: dict[str, Any] = {
            "latents": torch.randn(shape, generator=generator),
            "noise": torch.randn(shape, generator=generator),
            "timesteps": torch.randint(0, TIMESTEPS, (micro_batch_size,), generator=generator),
            "labels": torch.randint(0, self.num_classes, (micro_batch_size,), generator=generator),
        }
        batch.update(_schedule_at(batch["timesteps"]))
        return {key: value.to(device) for key, value in batch.items()}

    def loss(self, model: torch.nn.Module, batch: Any) -> torch.Tensor:
        """DiT's loss: noise-prediction MSE, plus the variational bound of the learned
        variance with the predicted mean frozen (``training_losses``, ``_vb_terms_bpd``)."""
        import torch

        x0, noise, t = batch["latents"], batch["noise"], batch["timesteps"]
        x_t = batch["sqrt_alphas_cumprod"] * x0 + batch["sqrt_one_minus_alphas_cumprod"] * noise
        # The model takes its inputs in its own dtype (bf16/fp16 under DeepSpeed's mixed
        # precision); the diffusion arithmetic stays in fp32, as with autocast.
        output = model(
            x_t.to(_floating_dtype(model)),
            timestep=t,
            class_labels=batch["labels"],
            return_dict=False,
        )[0].float()
        if not self.learn_sigma:
            return _mean_flat((noise - output) ** 2).mean()
        eps, var_values = output.split(self.latent_channels, dim=1)
        mse = _mean_flat((noise - eps) ** 2)
        # Variational bound: the posterior q(x_{t-1} | x_t, x_0) against the model's
        # Gaussian, whose mean comes from the frozen noise prediction and whose log-variance
        # interpolates between the posterior's and beta_t's (learned range).
        c1, c2 = batch["posterior_mean_coef1"], batch["posterior_mean_coef2"]
        true_mean = c1 * x0 + c2 * x_t
        true_log_var = batch["posterior_log_variance_clipped"]
        frac = (var_values + 1) / 2
        model_log_var = frac * batch["log_betas"] + (1 - frac) * true_log_var
        pred_x0 = (
            batch["sqrt_recip_alphas_cumprod"] * x_t
            - batch["sqrt_recipm1_alphas_cumprod"] * eps.detach()
        )
        model_mean = c1 * pred_x0 + c2 * x_t
        kl = 0.5 * (
            -1.0
            + model_log_var
            - true_log_var
            + torch.exp(true_log_var - model_log_var)
            + (true_mean - model_mean) ** 2 * torch.exp(-model_log_var)
        )
        kl = _mean_flat(kl) / math.log(2.0)
        nll = -_discretized_gaussian_log_likelihood(x0, model_mean, 0.5 * model_log_var)
        nll = _mean_flat(nll) / math.log(2.0)
        vb = torch.where(t == 0, nll, kl)
        return (mse + vb).mean()

    def shard_units(self, model: torch.nn.Module) -> list[torch.nn.Module]:
        """Each block's timestep-and-class embedding, then the blocks: diffusers' DiT calls
        the first block's embedding from its own forward (for the final layer's
        conditioning), outside that block, so it is a unit of its own."""
        blocks = list(model.transformer_blocks)
        embeddings = [b.norm1.emb for b in blocks if getattr(b.norm1, "emb", None) is not None]
        return [*embeddings, *blocks]

    def enable_activation_checkpointing(
        self, model: torch.nn.Module, blocks: int | None = None, policy: str = "full"
    ) -> None:
        # diffusers' own switch: every transformer block recomputed in full in backward,
        # through torch.utils.checkpoint without reentrancy (works with ZeRO-3's parameter
        # hooks); it has no switch per block nor a policy, so otherwise the blocks are
        # wrapped one by one.
        if blocks is None and policy == "full":
            model.enable_gradient_checkpointing()
            return
        from autotune.workloads.checkpointing import checkpoint_leading_blocks

        chosen = self.checkpoint_blocks(model)
        checkpoint_leading_blocks(chosen, len(chosen) if blocks is None else blocks, policy)

    def checkpoint_blocks(self, model: torch.nn.Module) -> list[torch.nn.Module]:
        return list(model.transformer_blocks)

    def active_params(self, model: torch.nn.Module) -> int:
        """Parameters applied to every token: all but the per-sample conditioning (each
        block's timestep and class embedding and adaLN modulation, and the final layer's
        modulation run once per sample, not per patch)."""
        per_sample = {
            id(p)
            for block in model.transformer_blocks
            for p in block.norm1.parameters()  # AdaLayerNormZero: embeddings + modulation
        }
        per_sample |= {id(p) for p in model.proj_out_1.parameters()}
        unique = {id(p): p for p in model.parameters()}
        return sum(p.numel() for key, p in unique.items() if key not in per_sample)

    def trace_fingerprint(self) -> dict[str, Any] | None:
        return {"class": f"{type(self).__module__}.{type(self).__qualname__}", **vars(self)}

    def describe(self) -> str:
        return (
            f"{self.name} (DiT, {self.layers} layers, hidden {self.hidden}, patch {self.patch}, "
            f"{self.tokens_per_sample} tokens of a {self.latent_size}x{self.latent_size}x"
            f"{self.latent_channels} latent)"
        )


def _floating_dtype(model: torch.nn.Module) -> torch.dtype:
    """The dtype the model computes in: its first floating-point parameter's (DeepSpeed
    casts parameters, and keeps that dtype on ZeRO-3's partitioned ones)."""
    import torch

    for parameter in model.parameters():
        if parameter.is_floating_point():
            return parameter.dtype
    return torch.get_default_dtype()


def _mean_flat(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.mean(dim=tuple(range(1, tensor.dim())))


def _schedule_at(timesteps: torch.Tensor) -> dict[str, torch.Tensor]:
    """The linear schedule's coefficients at each timestep, shaped to broadcast over a
    latent (``GaussianDiffusion.__init__`` of DiT, computed in float64, then fp32)."""
    import torch

    betas = torch.linspace(BETA_START, BETA_END, TIMESTEPS, dtype=torch.float64)
    alphas_cumprod = torch.cumprod(1.0 - betas, dim=0)
    previous = torch.cat([torch.ones(1, dtype=torch.float64), alphas_cumprod[:-1]])
    posterior_variance = betas * (1.0 - previous) / (1.0 - alphas_cumprod)
    # the posterior variance is 0 at t = 0: clip its log to the next step's
    posterior_log_clipped = torch.log(torch.cat([posterior_variance[1:2], posterior_variance[1:]]))
    table = {
        "sqrt_alphas_cumprod": alphas_cumprod.sqrt(),
        "sqrt_one_minus_alphas_cumprod": (1.0 - alphas_cumprod).sqrt(),
        "sqrt_recip_alphas_cumprod": (1.0 / alphas_cumprod).sqrt(),
        "sqrt_recipm1_alphas_cumprod": (1.0 / alphas_cumprod - 1).sqrt(),
        "posterior_mean_coef1": betas * previous.sqrt() / (1.0 - alphas_cumprod),
        "posterior_mean_coef2": (1.0 - previous) * (1.0 - betas).sqrt() / (1.0 - alphas_cumprod),
        "posterior_log_variance_clipped": posterior_log_clipped,
        "log_betas": torch.log(betas),
    }
    return {key: values[timesteps].float().view(-1, 1, 1, 1) for key, values in table.items()}


def _approx_standard_normal_cdf(x: torch.Tensor) -> torch.Tensor:
    import torch

    return 0.5 * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def _discretized_gaussian_log_likelihood(
    x: torch.Tensor, means: torch.Tensor, log_scales: torch.Tensor
) -> torch.Tensor:
    """Log-likelihood of data discretised to 256 bins in [-1, 1] under a Gaussian
    (``diffusion/diffusion_utils.py`` of DiT, after Ho et al. 2020)."""
    import torch

    centered = x - means
    inv_stdv = torch.exp(-log_scales)
    cdf_plus = _approx_standard_normal_cdf(inv_stdv * (centered + 1.0 / 255.0))
    cdf_min = _approx_standard_normal_cdf(inv_stdv * (centered - 1.0 / 255.0))
    log_cdf_plus = torch.log(cdf_plus.clamp(min=1e-12))
    log_one_minus_cdf_min = torch.log((1.0 - cdf_min).clamp(min=1e-12))
    log_cdf_delta = torch.log((cdf_plus - cdf_min).clamp(min=1e-12))
    return torch.where(
        x < -0.999,
        log_cdf_plus,
        torch.where(x > 0.999, log_one_minus_cdf_min, log_cdf_delta),
    )


def dit(size: str, patch: int) -> DiTWorkload:
    """DiT-<size>/<patch> at 256 px (latent 32 x 32 x 4), global batch 256 as in the paper."""
    layers, hidden, heads = DIT_SIZES[size]
    return DiTWorkload(
        f"dit-{size}-{patch}", layers=layers, hidden=hidden, heads=heads, patch=patch
    )


def dit_tiny() -> DiTWorkload:
    """A 0.2M-parameter DiT for CPU tests: 2 blocks of hidden 64 on an 8 x 8 x 4 latent at
    patch 2 (16 tokens), 10 classes; a CPU step takes milliseconds."""
    return DiTWorkload(
        "dit-tiny",
        layers=2,
        hidden=64,
        heads=4,
        patch=2,
        latent_size=8,
        num_classes=10,
        default_global_batch=16,
    )
