"""Losses on TD errors in PyTorch, matching :mod:`perx.losses` elementwise (004 eq. 2, 7, 8, 10, 29, 31).

Each takes ``delta`` (any shape), returns ``reduction(elementwise loss)``: ``"mean"`` (default),
``"sum"`` or ``"none"``, as in ``torch.nn``. Losses used under prioritized sampling (MSE, L1, Huber)
accept importance-sampling ``weights`` (shape of ``delta``), multiplied in before the reduction.
Quantities the theory holds fixed are detached: PAL's lambda and PER's eta are constants, so
autograd gives exactly the analytic gradients of :mod:`perx.losses` (tests/torch/test_losses.py).
"""

from __future__ import annotations

import torch

_REDUCTIONS = ("mean", "sum", "none")


def _reduce(loss: torch.Tensor, weights: torch.Tensor | None, reduction: str) -> torch.Tensor:
    if weights is not None:
        weights = torch.as_tensor(weights, dtype=loss.dtype, device=loss.device)
        if weights.shape != loss.shape:
            raise ValueError(f"weights: shape {tuple(weights.shape)} != delta's {tuple(loss.shape)}")
        loss = loss * weights
    if reduction == "mean":
        return loss.mean()
    if reduction == "sum":
        return loss.sum()
    if reduction == "none":
        return loss
    raise ValueError(f"reduction: must be one of {_REDUCTIONS}, got {reduction!r}")


def _positive(value: float, name: str) -> float:
    if not value > 0:
        raise ValueError(f"{name}: must be > 0, got {value!r}")
    return float(value)


def mse(delta: torch.Tensor, weights: torch.Tensor | None = None, reduction: str = "mean") -> torch.Tensor:
    """0.5 delta^2."""
    return _reduce(0.5 * delta * delta, weights, reduction)


def l1(delta: torch.Tensor, weights: torch.Tensor | None = None, reduction: str = "mean") -> torch.Tensor:
    """|delta|."""
    return _reduce(delta.abs(), weights, reduction)


def huber_elementwise(delta: torch.Tensor, kappa: float | torch.Tensor) -> torch.Tensor:
    """Elementwise Huber loss with threshold kappa (004 eq. 2 / eq. 29): 0.5 delta^2 for |delta| <= kappa, else
    kappa (|delta| - kappa / 2). ``kappa``: a float, or a tensor broadcastable to ``delta`` (the agents' [R, 1]:
    one threshold per lockstep run). The one Huber of perx's torch layer: :func:`huber` and the agents use it."""
    a = delta.abs()
    return torch.where(a <= kappa, 0.5 * delta * delta, kappa * (a - 0.5 * kappa))


def huber(delta: torch.Tensor, kappa: float = 1.0, weights: torch.Tensor | None = None,
          reduction: str = "mean") -> torch.Tensor:
    """Huber loss, threshold kappa (004 eq. 2 / eq. 29). Equals ``torch.nn.functional.huber_loss``
    with ``delta=kappa`` (elementwise), plus IS weights."""
    kappa = _positive(kappa, "kappa")
    return _reduce(huber_elementwise(delta, kappa), weights, reduction)


def pal_elementwise(delta: torch.Tensor, alpha: float | torch.Tensor, kappa: float | torch.Tensor,
                    lam: float | torch.Tensor | None = None, *, priority: torch.Tensor | None = None,
                    dim: int | None = None) -> torch.Tensor:
    """Elementwise PAL (004 eq. 10 / eq. 31) divided by lambda: 0.5 kappa^alpha delta^2 for |delta| <= kappa, else
    kappa |delta|^(1+alpha) / (1+alpha).

    lambda = mean max(|p|, kappa)^alpha of the batch, detached (a constant of the loss), where p is ``priority``
    (default delta; TD3 passes the larger |delta| of its two critics, one lambda for both as 004's code does),
    the mean taken over ``dim`` (None: every element; the agents' 1: per lockstep run), unless ``lam`` is given.
    ``alpha`` and ``kappa``: floats or tensors broadcastable to ``delta`` ([R, 1] per run). The one PAL of perx's
    torch layer: :func:`pal` and the agents use it."""
    a = delta.abs()
    if lam is None:
        p = (a if priority is None else priority).detach().clamp(min=kappa).pow(alpha)
        lam = p.mean() if dim is None else p.mean(dim=dim, keepdim=True)
    return torch.where(a <= kappa, 0.5 * kappa**alpha * delta * delta,
                       kappa * a.clamp(min=kappa).pow(1 + alpha) / (1 + alpha)) / lam


def pal(delta: torch.Tensor, alpha: float = 0.4, kappa: float = 1.0, lam: float | torch.Tensor | None = None,
        reduction: str = "mean") -> torch.Tensor:
    """Prioritized Approximation Loss (004 eq. 10 / eq. 31), for uniformly sampled batches.

    lambda = mean_j max(|delta_j|^alpha, kappa^alpha): estimated from this batch (detached) unless
    given. Uniform sampling + PAL has the expected gradient of LAP sampling + Huber (Observation 4).
    """
    kappa = _positive(kappa, "kappa")
    if alpha < 0:
        raise ValueError(f"alpha: must be >= 0, got {alpha!r}")
    return _reduce(pal_elementwise(delta, alpha, kappa, lam), None, reduction)


def per_equivalent(delta: torch.Tensor, alpha: float = 0.6, beta: float = 0.4, tau: float = 2.0, *,
                   eta: float, size: int, reduction: str = "mean") -> torch.Tensor:
    """L_PER^tau = eta N |delta|^p / p with p = tau + alpha - alpha beta (004 eq. 7), for analysis.

    ``eta`` and ``size`` (N) describe the whole buffer (``perx.losses.per_eta``)."""
    power = tau + alpha - alpha * beta
    return _reduce(eta * size / power * delta.abs().pow(power), None, reduction)


def per_equivalent_huber(delta: torch.Tensor, alpha: float = 0.6, beta: float = 0.4, kappa: float = 1.0, *,
                         eta: float, size: int, reduction: str = "mean") -> torch.Tensor:
    """Corollary 3 (004 eq. 8) with threshold kappa: the uniformly sampled equivalent of Huber + PER."""
    kappa = _positive(kappa, "kappa")
    a = delta.abs()
    p2, p1 = 2 + alpha - alpha * beta, 1 + alpha - alpha * beta
    # clamp the branch not taken, so its gradient stays finite (torch.where differentiates both)
    loss = torch.where(a <= kappa, a.clamp(max=kappa).pow(p2) / p2, kappa * a.clamp(min=kappa).pow(p1) / p1)
    return _reduce(eta * size * loss, None, reduction)
