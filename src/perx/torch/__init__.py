"""PyTorch versions of perx's losses, and batch conversion. The core never imports torch; this package, the agents,
perx.sb3, perx.torchrl and the distributed learner do."""

from perx.torch.batch import as_tensors
from perx.torch.losses import (
    huber,
    huber_elementwise,
    l1,
    mse,
    pal,
    pal_elementwise,
    per_equivalent,
    per_equivalent_huber,
)

__all__ = [
    "as_tensors",
    "huber",
    "huber_elementwise",
    "l1",
    "mse",
    "pal",
    "pal_elementwise",
    "per_equivalent",
    "per_equivalent_huber",
]
