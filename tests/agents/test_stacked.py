"""Lockstep networks and optimisers (perx.agents.stacked): R stacked runs behave exactly as R separate
torch.nn networks and torch.optim optimisers, whatever the internal layouts."""

import numpy as np
import pytest
import torch

from perx.agents import stacked

NETS = {
    "minatar": (lambda: stacked.minatar_net(4, 6), (4, 10, 10), 5),
    "nature": (lambda: stacked.nature_cnn(4, 3), (4, 84, 84), 2),
    "mlp": (lambda: stacked.mlp(11, 3), (11,), 5),
    # stride, padding, two convolutions in a row, a non-square spatial map before the flatten
    "same-valid-padding": (lambda: torch.nn.Sequential(torch.nn.Conv2d(3, 4, 4, padding="same"), torch.nn.ReLU(),
                                                       torch.nn.Conv2d(4, 2, 3, padding="valid"), torch.nn.Flatten(),
                                                       torch.nn.ReLU(), torch.nn.Linear(2 * 5 * 5, 3)), (3, 7, 7), 3),
    # no Linear after the Flatten: the output keeps torch's (c, h, w) order
    "conv-head": (lambda: torch.nn.Sequential(torch.nn.Conv2d(2, 3, 3), torch.nn.Tanh(), torch.nn.Flatten()),
                  (2, 5, 6), 3),
    "odd-conv": (lambda: torch.nn.Sequential(torch.nn.Conv2d(3, 5, 3, stride=2, padding=1), torch.nn.ReLU(),
                                             torch.nn.Conv2d(5, 4, 2), torch.nn.Flatten(),
                                             torch.nn.Linear(4 * 3 * 5, 2)), (3, 8, 12), 4),
}


def plain_nets(make, seeds):
    nets = []
    for s in seeds:
        torch.manual_seed(s)
        nets.append(make())
    return nets


def sparse_input(shape, density=0.05, seed=1):
    """Mostly zeros (as MinAtar's observations), the rest signed values: small maps take the scatter path."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g) * (torch.rand(shape, generator=g) < density)


@pytest.mark.filterwarnings("ignore:Using padding='same'")  # torch's own reference network warns
@pytest.mark.parametrize("inputs", ["dense", "sparse"])
@pytest.mark.parametrize("name", list(NETS))
def test_stacked_net_equals_each_run_s_torch_network_in_outputs_and_gradients(name, inputs):
    make, shape, batch = NETS[name]
    seeds = [0, 7, 3]
    net, plain = stacked.StackedNet(make, seeds), plain_nets(make, seeds)
    if inputs == "dense":
        x = torch.randn(len(seeds), batch, *shape, generator=torch.Generator().manual_seed(1))
    else:
        x = sparse_input((len(seeds), batch, *shape))
    y = net(x)
    expected = torch.stack([p(x[r]) for r, p in enumerate(plain)])
    torch.testing.assert_close(y, expected, rtol=1e-5, atol=1e-6)
    y.square().sum().backward()
    expected.square().sum().backward()
    layouts = dict(zip([k for k, _ in net.named_parameters()], net.layouts(), strict=True))
    for k, p in net.named_parameters():
        for r, single in enumerate(plain):
            want = dict(single.named_parameters())[k.removeprefix("layers.")].grad
            torch.testing.assert_close(layouts[k][0](p.grad[r]), want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", list(NETS))
def test_run_state_is_torch_nn_s_layout_and_round_trips(name):
    make = NETS[name][0]
    net = stacked.StackedNet(make, [5, 6])
    single = plain_nets(make, [6])[0]
    state = net.run_state(1)
    assert {k: v.shape for k, v in state.items()} == {f"layers.{k}": v.shape for k, v in single.state_dict().items()}
    for k, v in single.state_dict().items():
        assert torch.equal(state[f"layers.{k}"], v)  # run 1 was initialised under seed 6, as torch.nn would
    other = stacked.StackedNet(make, [1, 2])
    before = {k: v[1].clone() for k, v in other.state_dict().items()}
    other.load_run_state(0, state)
    for k, v in other.state_dict().items():
        assert torch.equal(v[0], net.state_dict()[k][1])  # stacked layouts equal after the round trip
        assert torch.equal(v[1], before[k])  # the other run is untouched


def test_a_network_with_an_unsupported_layer_is_refused():
    with pytest.raises(TypeError, match="make: unsupported layer"):
        stacked.StackedNet(lambda: torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Sigmoid()), [0])
    with pytest.raises(TypeError, match=r"only nn\.Flatten"):
        stacked.StackedNet(lambda: torch.nn.Sequential(torch.nn.Flatten(2), torch.nn.Linear(2, 2)), [0])
    with pytest.raises(TypeError, match="groups"):
        stacked.StackedNet(lambda: torch.nn.Sequential(torch.nn.Conv2d(2, 2, 3, groups=2)), [0])


@pytest.mark.parametrize("path", ["compiled", "torch"])
@pytest.mark.parametrize("kind", ["adam", "rmsprop"])
def test_stacked_optimizer_equals_torch_optim_run_by_run(kind, path, monkeypatch):
    if path == "torch":  # the path GPU tensors take
        monkeypatch.setattr(stacked, "_compiled", lambda *tensors: False)
    torch.manual_seed(0)
    lrs = [1e-2, 2.5e-3]
    p = torch.nn.Parameter(torch.randn(2, 5, 3))
    ours = stacked.StackedOptimizer([p], torch.tensor(lrs), kind, **({"eps": 0.01, "alpha": 0.95} if kind == "rmsprop"
                                                                        else {}))
    singles = [torch.nn.Parameter(p[r].detach().clone()) for r in range(2)]
    opts = [torch.optim.Adam([s], lr=lr) if kind == "adam" else
            torch.optim.RMSprop([s], lr=lr, alpha=0.95, eps=0.01, centered=True)
            for s, lr in zip(singles, lrs, strict=True)]
    for _ in range(5):
        g = torch.randn(2, 5, 3)
        p.grad = g.clone()
        ours.step()
        for r, (s, o) in enumerate(zip(singles, opts, strict=True)):
            s.grad = g[r].clone()
            o.step()
            torch.testing.assert_close(p[r].detach(), s.detach(), rtol=1e-6, atol=1e-7)


def test_compiled_optimizer_path_takes_only_cpu_float32_contiguous_tensors():
    x = torch.zeros(2, 3)
    assert stacked._compiled(x, x.clone())
    assert not stacked._compiled(x, x.double())
    assert not stacked._compiled(x, torch.zeros(3, 2).t())


def test_optimizer_run_state_uses_the_network_s_layout_and_round_trips():
    net = stacked.StackedNet(lambda: stacked.minatar_net(4, 6), [0, 1])
    opt = stacked.StackedOptimizer(list(net.parameters()), torch.tensor([1e-3, 1e-3]), "rmsprop",
                                   layouts=net.layouts())
    net(torch.randn(2, 3, 4, 10, 10)).sum().backward()
    opt.step()
    state = opt.run_state(1)
    shapes = [v.shape for v in net.run_state(1).values()]
    assert [m.shape for m in state["m"]] == shapes and [v.shape for v in state["v"]] == shapes
    twin = stacked.StackedOptimizer(list(net.parameters()), torch.tensor([1e-3, 1e-3]), "rmsprop",
                                    layouts=net.layouts())
    twin.load_run_state(1, state)
    for a, b in zip(twin.state, opt.state, strict=True):
        assert torch.equal(a["m"][1], b["m"][1]) and torch.equal(a["v"][1], b["v"][1])
    with pytest.raises(ValueError, match="layouts: one per parameter"):
        stacked.StackedOptimizer(list(net.parameters()), torch.tensor([1e-3, 1e-3]), layouts=net.layouts()[:1])


def test_channels_last_rows_put_each_feature_where_torch_s_flatten_has_it():
    rows = stacked._channels_last_rows(channels=3, features=3 * 4)
    # stacked row j = hw * C + c holds nn feature c * HW + hw
    assert rows.tolist() == [0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11]
    assert sorted(rows.tolist()) == list(range(12))
    assert np.array_equal(np.argsort(rows)[rows], np.arange(12))


def test_the_compiled_step_moves_autograd_s_version_so_a_stale_graph_refuses_backward():
    net = stacked.StackedNet(lambda: stacked.mlp(3, 1, hidden=4), [0, 1])
    opt = stacked.StackedOptimizer(list(net.parameters()), torch.tensor([0.1, 0.1]), "adam")
    x = torch.randn(2, 4, 3)
    net(x).sum().backward()
    stale = net(x).sum()  # saved the weights before the step
    assert all(stacked._compiled(p, p.grad) for p in net.parameters())
    opt.step()
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        stale.backward()


def test_the_optimizer_finds_each_weight_s_layout_even_after_a_device_move():
    net = stacked.StackedNet(lambda: stacked.minatar_net(4, 6), [0, 1])
    params = list(net.parameters())
    net.to("meta")  # a move that replaces every parameter (as a GPU move may)
    assert all(p is not q for p, q in zip(params, net.parameters(), strict=True))
    opt = stacked.StackedOptimizer(list(net.parameters()), torch.tensor([1e-3, 1e-3]), "rmsprop")
    assert [lay[0] for lay in opt.layouts] == [lay[0] for lay in net.layouts()]
    assert opt.layouts[2][0] != stacked._SAME[0]  # the linear weight is [R, in, out] inside


def test_the_unfold_and_the_grouped_convolution_give_the_same_outputs_and_gradients(monkeypatch):
    conv = stacked.StackedConv2d([(torch.manual_seed(s), torch.nn.Conv2d(3, 5, (3, 2), stride=(1, 2)))[1]
                                  for s in range(3)])
    x = torch.randn(3, 4, 3, 9, 8, generator=torch.Generator().manual_seed(0))
    results = []
    for pixels in (10**9, 0):  # every map small enough to unfold; none (the grouped convolution)
        monkeypatch.setattr(stacked, "UNFOLD_MAX_PIXELS", pixels)
        conv.zero_grad(set_to_none=True)
        y = conv(x)
        y.square().sum().backward()
        results.append((y.detach(), conv.weight.grad.clone(), conv.bias.grad.clone()))
    assert results[0][0].permute(0, 1, 3, 4, 2).is_contiguous()  # the unfold's result is channels-last
    assert not results[1][0].permute(0, 1, 3, 4, 2).is_contiguous()
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("density", [0.0, 0.02, 0.3])
@pytest.mark.parametrize("geometry", [dict(kernel_size=3), dict(kernel_size=(3, 2), stride=(1, 2)),
                                      dict(kernel_size=4, padding="same"), dict(kernel_size=3, stride=2, padding=1),
                                      dict(kernel_size=(2, 5), stride=(3, 1), padding=(2, 1)),
                                      dict(kernel_size=2, padding=3)])  # output rows of padding alone
@pytest.mark.parametrize("relu", [False, True])
def test_the_scatter_unfold_and_grouped_convolutions_agree_in_outputs_and_gradients(monkeypatch, geometry,
                                                                                    density, relu):
    conv = stacked.StackedConv2d([(torch.manual_seed(s), torch.nn.Conv2d(3, 5, **geometry))[1] for s in range(3)],
                                 relu=relu)
    x = sparse_input((3, 4, 3, 9, 8), density)
    calls = []
    scatter = stacked._scatter_forward
    monkeypatch.setattr(stacked, "_scatter_forward", lambda *a: (calls.append(1), scatter(*a))[1])
    results = []
    for max_density, pixels in ((1.0, 10**9), (-1.0, 10**9), (1.0, 0)):  # scatter, unfold, grouped
        monkeypatch.setattr(stacked, "SCATTER_MAX_DENSITY", max_density)
        monkeypatch.setattr(stacked, "UNFOLD_MAX_PIXELS", pixels)
        conv.zero_grad(set_to_none=True)
        y = conv(x)
        (y * torch.linspace(-1, 1, y.numel()).view(y.shape)).sum().backward()
        results.append((y.detach(), conv.weight.grad.clone(), conv.bias.grad.clone()))
        if len(results) == 1:
            assert len(calls) == 1
            with torch.no_grad():  # the path without autograd gives the same outputs
                torch.testing.assert_close(conv(x), y.detach(), rtol=0, atol=0)
            assert len(calls) == 2
    assert len(calls) == 2  # only the first setting scattered
    assert results[0][0].permute(0, 1, 3, 4, 2).is_contiguous()  # channels-last, as the unfold's
    assert (results[0][0] >= 0).all() if relu else (results[0][0] < 0).any()
    for other in results[1:]:
        for a, b in zip(results[0], other, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_a_sparse_observation_is_scattered_and_a_dense_one_is_unfolded(monkeypatch):
    net = stacked.StackedNet(lambda: stacked.minatar_net(4, 3), [0, 1])
    calls = []
    scatter = stacked._scatter_forward
    monkeypatch.setattr(stacked, "_scatter_forward", lambda *a: (calls.append(1), scatter(*a))[1])
    obs = (torch.rand(2, 8, 4, 10, 10, generator=torch.Generator().manual_seed(0)) < 0.08).float()
    net(obs)
    assert len(calls) == 1
    net(torch.ones(2, 8, 4, 10, 10))  # dense
    net(sparse_input((2, 8, 4, 10, 10)).requires_grad_())  # an input that needs a gradient
    assert len(calls) == 1


def test_a_scattered_graph_refuses_backward_after_its_input_changed_in_place():
    conv = stacked.StackedConv2d([torch.nn.Conv2d(2, 3, 3)])
    x = sparse_input((1, 2, 6, 6, 2)).permute(0, 1, 4, 2, 3)  # channels-last memory: no copy is taken
    y = conv(x)
    x.mul_(2)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


@pytest.mark.parametrize("dense_runs", [[1], [0, 2], [0, 1, 2], []])
def test_each_run_takes_the_path_of_its_own_input_and_computes_as_it_would_alone(dense_runs):
    layers = [(torch.manual_seed(s), torch.nn.Conv2d(3, 5, 3, padding=1))[1] for s in range(3)]
    x = sparse_input((3, 4, 3, 7, 6), density=0.03)
    for r in dense_runs:
        x[r] = torch.randn(4, 3, 7, 6, generator=torch.Generator().manual_seed(r))
    group = stacked.StackedConv2d(layers, relu=True)
    y = group(x)
    (y * torch.linspace(-1, 1, y.numel()).view(y.shape)).sum().backward()
    for r in range(3):
        alone = stacked.StackedConv2d(layers[r:r + 1], relu=True)
        y1 = alone(x[r:r + 1])
        (y1 * torch.linspace(-1, 1, y.numel()).view(y.shape)[r:r + 1]).sum().backward()
        assert torch.equal(y[r], y1[0])
        if r in dense_runs:
            # the dense path's weight gradient is one batched matrix product over the runs, whose rounding
            # BLAS may choose by batch count (MKL on an AMD EPYC differs from one run alone by ~1 ulp here)
            torch.testing.assert_close(group.weight.grad[r], alone.weight.grad[0])
        else:  # the scatter kernel is ours: run by run, bit for bit
            assert torch.equal(group.weight.grad[r], alone.weight.grad[0])
        assert torch.equal(group.bias.grad[r], alone.bias.grad[0])
        want = torch.relu(layers[r](x[r]))
        torch.testing.assert_close(y[r], want, rtol=1e-5, atol=1e-5)
