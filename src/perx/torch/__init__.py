"""PyTorch losses and batch conversion. The only part of perx that imports torch."""

from perx.torch.batch import as_tensors
from perx.torch.losses import huber, l1, mse, pal, per_equivalent, per_equivalent_huber

__all__ = ["as_tensors", "huber", "l1", "mse", "pal", "per_equivalent", "per_equivalent_huber"]
