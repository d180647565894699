"""Convert a sampled :class:`perx.Batch` to torch tensors."""

from __future__ import annotations

import numpy as np
import torch

from perx.buffer import Batch


def as_tensors(batch: Batch, device: str | torch.device | None = None,
               float_dtype: torch.dtype = torch.float32, *, pin_memory: bool | None = None
               ) -> dict[str, torch.Tensor]:
    """Every field of ``batch`` as a tensor on ``device`` (a dict field as a dict of tensors), plus ``"weights"``
    (float_dtype) and ``"indices"`` (int64, kept on the host: they go back to ``update_priorities``).

    Floating fields become ``float_dtype``; integer and bool fields keep their dtype. The batch's
    arrays are fresh copies, so host tensors share their memory (no copy) where the dtype stays: a batch
    refilled with ``sample(out=batch)`` refills those tensors too, but not the converted ones (``weights``,
    float64 fields): convert again after each sample. For a CUDA device the host
    tensors are pinned (``pin_memory`` default True there) and copied with ``non_blocking=True``, so the
    copies overlap with whatever the GPU is doing; CUDA's stream order makes them safe to use at once.
    """
    device = torch.device(device) if device is not None else None
    cuda = device is not None and device.type == "cuda"
    pin = cuda if pin_memory is None else bool(pin_memory)
    def convert(arr: np.ndarray) -> torch.Tensor:
        t = torch.from_numpy(np.ascontiguousarray(arr))
        if t.is_floating_point() and t.dtype != float_dtype:
            t = t.to(float_dtype)
        if pin:
            t = t.pin_memory()
        return t.to(device, non_blocking=pin) if device is not None else t

    out = {}
    fields = dict(batch.items())
    fields["weights"] = batch.weights
    for name, arr in fields.items():  # a dict field (perx._nested) becomes a dict of tensors
        out[name] = {k: convert(a) for k, a in arr.items()} if isinstance(arr, dict) else convert(arr)
    out["indices"] = torch.from_numpy(np.ascontiguousarray(batch.indices))
    return out
