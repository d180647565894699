"""perx.torch: autograd equals the analytic gradients; values match perx.losses; API details."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import perx  # noqa: E402
from perx import losses  # noqa: E402
from perx import torch as pt  # noqa: E402
from perx.experiments.theory import check_autograd  # noqa: E402
from perx.theory import td_errors  # noqa: E402


def test_autograd_gradients_equal_analytic_gradients():
    result = check_autograd()
    assert result.passed, result.max_abs_error


@pytest.mark.parametrize(("torch_fn", "numpy_fn"), [
    (lambda d: pt.mse(d, reduction="none"), losses.mse),
    (lambda d: pt.l1(d, reduction="none"), losses.l1),
    (lambda d: pt.huber(d, 0.3, reduction="none"), lambda d: losses.huber(d, 0.3)),
    (lambda d: pt.pal(d, 0.4, 1.0, reduction="none"), lambda d: losses.pal(d, 0.4, 1.0)),
    (lambda d: pt.pal(d, 0.6, 0.01, lam=2.0, reduction="none"), lambda d: losses.pal(d, 0.6, 0.01, lam=2.0)),
    (lambda d: pt.per_equivalent(d, 0.6, 0.4, 2.0, eta=0.003, size=500, reduction="none"),
     lambda d: losses.per_equivalent(d, 0.6, 0.4, 2.0, eta=0.003, size=500)),
    (lambda d: pt.per_equivalent_huber(d, 0.6, 0.4, 1.0, eta=0.003, size=500, reduction="none"),
     lambda d: losses.per_equivalent_huber(d, 0.6, 0.4, 1.0, eta=0.003, size=500)),
])
def test_torch_values_match_numpy(torch_fn, numpy_fn):
    d = td_errors(500)
    np.testing.assert_allclose(torch_fn(torch.tensor(d, dtype=torch.float64)).numpy(), numpy_fn(d),
                               rtol=1e-13, atol=1e-15)
    # float32 inputs agree to float32 precision
    np.testing.assert_allclose(torch_fn(torch.tensor(d, dtype=torch.float32)).numpy(), numpy_fn(d),
                               rtol=2e-5, atol=1e-6)


def test_huber_equals_torch_huber_loss():
    d = torch.tensor(td_errors(300), dtype=torch.float64)
    for kappa in (0.01, 1.0, 3.0):
        ref = torch.nn.functional.huber_loss(d, torch.zeros_like(d), delta=kappa)
        assert torch.allclose(pt.huber(d, kappa), ref, rtol=1e-14)


def test_weights_and_reductions():
    d = torch.tensor([1.0, -2.0, 3.0], dtype=torch.float64)
    w = torch.tensor([1.0, 0.5, 0.0], dtype=torch.float64)
    assert pt.mse(d, w, reduction="sum").item() == pytest.approx(0.5 + 1.0)
    assert pt.mse(d, w).item() == pytest.approx(1.5 / 3)
    assert pt.huber(d, 1.0, w, reduction="none").tolist() == [0.5, 0.75, 0.0]
    with pytest.raises(ValueError, match="reduction"):
        pt.mse(d, reduction="avg")
    with pytest.raises(ValueError, match="weights"):
        pt.mse(d, torch.ones(2))
    with pytest.raises(ValueError, match="kappa"):
        pt.huber(d, 0.0)


def test_pal_lambda_is_a_constant_for_autograd():
    """The batch estimate of lambda is detached: the gradient is (1/lambda) x the inner gradient."""
    d = torch.tensor([0.5, -2.0, 4.0], dtype=torch.float64, requires_grad=True)
    pt.pal(d, 0.4, 1.0, reduction="sum").backward()
    np.testing.assert_allclose(d.grad.numpy(), losses.pal_grad(d.detach().numpy(), 0.4, 1.0), rtol=1e-14)


def test_as_tensors_converts_a_batch():
    buf = perx.ReplayBuffer(10, perx.Proportional(), seed=0)
    buf.extend(obs=np.zeros((5, 3), np.float64), action=np.arange(5), done=np.zeros(5, bool))
    t = pt.as_tensors(buf.sample(4))
    assert t["obs"].dtype == torch.float32 and t["obs"].shape == (4, 3)
    assert t["action"].dtype == torch.int64 and t["done"].dtype == torch.bool
    assert t["weights"].dtype == torch.float32 and t["indices"].dtype == torch.int64
