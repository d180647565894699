"""perx.torch.as_tensors and torch tensors going back into the buffer."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import perx  # noqa: E402
import perx.torch as pt  # noqa: E402
from tests.conftest import filled  # noqa: E402


def test_host_tensors_share_the_batch_memory_and_keep_integer_dtypes():
    buf = filled(perx.Proportional(), capacity=20)
    batch = buf.sample(8, beta=0.5)
    t = pt.as_tensors(batch)
    assert t["obs"].dtype == torch.float32 and t["action"].dtype == torch.int64
    assert t["terminated"].dtype == torch.bool and t["weights"].dtype == torch.float32
    assert t["obs"].data_ptr() == batch["obs"].ctypes.data  # no copy on the host
    np.testing.assert_array_equal(t["indices"].numpy(), batch.indices)
    assert pt.as_tensors(batch, float_dtype=torch.float64)["reward"].dtype == torch.float64


def test_priorities_accept_tensors_that_require_grad():
    buf = filled(perx.Proportional(alpha=1.0, eps=0.0), capacity=20)
    t = pt.as_tensors(buf.sample(8))
    q = torch.zeros(8, requires_grad=True)
    delta = q - t["reward"] - 1.0
    assert buf.update_priorities(t["indices"], delta) == 8  # detached and copied by duck typing


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_copies_are_pinned_and_priorities_come_back_from_the_gpu():
    buf = filled(perx.Proportional(), capacity=20)
    t = pt.as_tensors(buf.sample(8), device="cuda")
    assert t["obs"].is_cuda and not t["indices"].is_cuda
    delta = (t["obs"][:, 0] * 0 + 2.0).requires_grad_()
    assert buf.update_priorities(t["indices"], delta) == 8
