"""Networks and optimisers for R independent runs trained in lockstep: every parameter has a leading
run axis, so one forward pass, one backward pass and one optimiser step serve all R runs.

Run r's parameters, gradients and optimiser state depend only on run r's data: convolutions are
grouped by run, linear layers are batched matrix products, the loss is a sum of per-run losses, and
Adam / RMSprop are elementwise (one optimiser per run, with a per-run step size). Each run is
initialised exactly as ``torch.nn`` would initialise the same network after ``torch.manual_seed(seed)``,
so a run's start does not depend on which runs share its process.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn


class StackedLinear(nn.Module):
    """R linear layers: x [R, B, in] -> [R, B, out]."""

    def __init__(self, layers: Sequence[nn.Linear]) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.stack([m.weight.detach() for m in layers]))  # [R, out, in]
        self.bias = nn.Parameter(torch.stack([m.bias.detach() for m in layers]))  # [R, out]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.baddbmm(self.bias.unsqueeze(1), x, self.weight.transpose(1, 2))


class StackedConv2d(nn.Module):
    """R convolutions as one grouped convolution: x [R, B, C, H, W] -> [R, B, C', H', W']."""

    def __init__(self, layers: Sequence[nn.Conv2d]) -> None:
        super().__init__()
        first = layers[0]
        self.stride, self.padding = first.stride, first.padding
        self.weight = nn.Parameter(torch.stack([m.weight.detach() for m in layers]))  # [R, C', C, k, k]
        self.bias = nn.Parameter(torch.stack([m.bias.detach() for m in layers]))  # [R, C']

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        runs, batch, channels = x.shape[:3]
        out = nn.functional.conv2d(
            x.transpose(0, 1).reshape(batch, runs * channels, *x.shape[3:]),
            self.weight.reshape(-1, *self.weight.shape[2:]), self.bias.reshape(-1),
            stride=self.stride, padding=self.padding, groups=runs)
        return out.reshape(batch, runs, -1, *out.shape[2:]).transpose(0, 1)


class StackedNet(nn.Module):
    """R copies of a sequential network made of ``nn.Conv2d``, ``nn.Linear``, ``nn.ReLU``, ``nn.Tanh`` and
    ``nn.Flatten`` layers, one per run, built from ``make()`` under each run's seed."""

    def __init__(self, make, seeds: Sequence[int]) -> None:
        super().__init__()
        nets = []
        for seed in seeds:
            torch.manual_seed(seed)
            nets.append(make())
        layers = []
        for parts in zip(*(net for net in nets), strict=True):
            kind = parts[0]
            if isinstance(kind, nn.Linear):
                layers.append(StackedLinear(parts))
            elif isinstance(kind, nn.Conv2d):
                layers.append(StackedConv2d(parts))
            elif isinstance(kind, nn.ReLU | nn.Tanh):
                layers.append(type(kind)())
            elif isinstance(kind, nn.Flatten):
                layers.append(_FlattenRuns())
            else:
                raise TypeError(f"make: unsupported layer {kind!r}")
        self.layers = nn.Sequential(*layers)
        self.runs = len(seeds)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [R, B, ...] -> [R, B, outputs]."""
        return self.layers(x)

    def run_state(self, r: int) -> dict[str, torch.Tensor]:
        """Run r's parameters (copies)."""
        return {k: v[r].detach().clone() for k, v in self.state_dict().items()}

    def load_run_state(self, r: int, state: dict[str, torch.Tensor]) -> None:
        with torch.no_grad():
            for k, v in self.state_dict().items():
                v[r].copy_(state[k])


class _FlattenRuns(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.flatten(2)


class StackedOptimizer:
    """Adam (``"adam"``) or centered RMSprop (``"rmsprop"``, torch's formula) for stacked parameters,
    with a step size per run (``lr``: float tensor [R]). Elementwise, so it is exactly one optimiser per
    run; tests compare it with ``torch.optim`` run by run."""

    def __init__(self, params: Sequence[torch.Tensor], lr: torch.Tensor, kind: str = "adam", *,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8, alpha: float = 0.95,
                 centered: bool = True) -> None:
        if kind not in ("adam", "rmsprop"):
            raise ValueError(f"kind: 'adam' or 'rmsprop', got {kind!r}")
        self.params = list(params)
        self.lr = lr
        self.kind, self.betas, self.eps, self.alpha, self.centered = kind, betas, eps, alpha, centered
        self.state = [{"m": torch.zeros_like(p), "v": torch.zeros_like(p)} for p in self.params]
        self.steps = 0

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        self.steps += 1
        for p, st in zip(self.params, self.state, strict=True):
            if p.grad is None:
                continue
            g = p.grad
            lr = self.lr.reshape(-1, *([1] * (p.dim() - 1)))  # [R, 1, ...]: a step size per run
            m, v = st["m"], st["v"]
            if self.kind == "adam":
                b1, b2 = self.betas
                m.mul_(b1).add_(g, alpha=1 - b1)
                v.mul_(b2).addcmul_(g, g, value=1 - b2)
                denom = (v / (1 - b2**self.steps)).sqrt_().add_(self.eps)
                p.addcdiv_(m * (lr / (1 - b1**self.steps)), denom, value=-1.0)
            else:
                a = self.alpha
                v.mul_(a).addcmul_(g, g, value=1 - a)
                if self.centered:
                    m.mul_(a).add_(g, alpha=1 - a)
                    avg = torch.addcmul(v, m, m, value=-1.0).sqrt_().add_(self.eps)
                else:
                    avg = v.sqrt().add_(self.eps)
                p.addcdiv_(g * lr, avg, value=-1.0)

    def run_state(self, r: int) -> dict:
        return {"steps": self.steps, "m": [s["m"][r].clone() for s in self.state],
                "v": [s["v"][r].clone() for s in self.state]}

    def load_run_state(self, r: int, state: dict) -> None:
        self.steps = int(state["steps"])
        for s, m, v in zip(self.state, state["m"], state["v"], strict=True):
            s["m"][r].copy_(m)
            s["v"][r].copy_(v)


def minatar_net(channels: int, actions: int) -> nn.Sequential:
    """The MinAtar paper's network (Young & Tian 2019): one 16-filter 3x3 convolution, a 128-unit layer."""
    return nn.Sequential(nn.Conv2d(channels, 16, 3, stride=1), nn.ReLU(), nn.Flatten(),
                         nn.Linear(16 * 8 * 8, 128), nn.ReLU(), nn.Linear(128, actions))


def nature_cnn(channels: int, actions: int) -> nn.Sequential:
    """The Nature DQN network of 004 Appendix D.2 (84x84 inputs, 4 stacked frames)."""
    return nn.Sequential(nn.Conv2d(channels, 32, 8, stride=4), nn.ReLU(), nn.Conv2d(32, 64, 4, stride=2), nn.ReLU(),
                         nn.Conv2d(64, 64, 3, stride=1), nn.ReLU(), nn.Flatten(), nn.Linear(3136, 512), nn.ReLU(),
                         nn.Linear(512, actions))


def mlp(inputs: int, outputs: int, hidden: int = 128, tanh: bool = False) -> nn.Sequential:
    """Two hidden ReLU layers; a tanh on the output with ``tanh`` (TD3's actor, 004 Table 6)."""
    layers = [nn.Linear(inputs, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, outputs)]
    return nn.Sequential(*layers, *([nn.Tanh()] if tanh else []))
