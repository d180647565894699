"""Convert a sampled :class:`perx.Batch` to torch tensors."""

from __future__ import annotations

import numpy as np
import torch

from perx.buffer import Batch


def as_tensors(batch: Batch, device: str | torch.device | None = None,
               float_dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """Every field of ``batch`` as a tensor on ``device``, plus ``"weights"`` (float_dtype) and
    ``"indices"`` (int64). Floating fields become ``float_dtype``; integer and bool fields keep their
    dtype. Arrays are copied once (``torch.as_tensor`` then ``.to``)."""
    out = {}
    for name, arr in batch.items():
        t = torch.as_tensor(np.ascontiguousarray(arr))
        if t.is_floating_point():
            t = t.to(float_dtype)
        out[name] = t.to(device) if device is not None else t
    out["weights"] = torch.as_tensor(batch.weights, dtype=float_dtype, device=device)
    out["indices"] = torch.as_tensor(batch.indices, device=device)
    return out
