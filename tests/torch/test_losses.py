"""perx.torch: autograd equals the analytic gradients; values match perx.losses; API details."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import perx  # noqa: E402
from perx import losses  # noqa: E402
from perx import torch as pt  # noqa: E402
from perx.experiments.theorems import td_errors  # noqa: E402
from perx.experiments.theory import check_autograd  # noqa: E402


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


def test_per_run_thresholds_give_each_run_the_loss_of_its_own_scalar_settings():
    """The agents' form: delta [R, B] with kappa and alpha [R, 1] (one lockstep run per row) equals, row by row,
    the scalar loss of that row's settings; PAL's lambda is each row's own batch mean (dim=1)."""
    g = torch.Generator().manual_seed(3)
    delta = torch.randn(4, 50, generator=g, dtype=torch.float64) * 2
    kappa = torch.tensor([[0.01], [0.5], [1.0], [3.0]], dtype=torch.float64)
    alpha = torch.tensor([[0.0], [0.4], [0.6], [1.0]], dtype=torch.float64)
    huber = pt.huber_elementwise(delta, kappa)
    pal = pt.pal_elementwise(delta, alpha, kappa, dim=1)
    for r in range(4):
        k, a = float(kappa[r]), float(alpha[r])
        torch.testing.assert_close(huber[r], pt.huber(delta[r], kappa=k, reduction="none"), rtol=1e-12, atol=0)
        torch.testing.assert_close(pal[r], pt.pal(delta[r], alpha=a, kappa=k, reduction="none"), rtol=1e-12,
                                   atol=0)
    # one lambda from a shared priority (TD3: the larger |delta| of two critics) scales the whole row
    priority = delta.abs() + 1.0
    lam = priority.clamp(min=kappa).pow(alpha).mean(dim=1, keepdim=True)
    torch.testing.assert_close(pt.pal_elementwise(delta, alpha, kappa, priority=priority, dim=1),
                               pt.pal_elementwise(delta, alpha, kappa, lam=lam), rtol=1e-12, atol=0)
