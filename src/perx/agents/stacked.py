"""Networks and optimisers for R independent runs trained in lockstep: every parameter has a leading
run axis, so one forward pass, one backward pass and one optimiser step serve all R runs.

Run r's parameters, gradients and optimiser state depend only on run r's data: convolutions and linear
layers are batched matrix products (one per run), the loss is a sum of per-run losses, and Adam /
RMSprop are elementwise (one optimiser per run, with a per-run step size). Each run is initialised
exactly as ``torch.nn`` would initialise the same network after ``torch.manual_seed(seed)``, so a run's
start does not depend on which runs share its process.

Layouts are chosen for speed on one CPU core (measured in docs/dqn.md, "Cost of replay and throughput"): a
linear weight is
stored as [R, in, out] (``x @ W``: one ``baddbmm`` without a transposed operand, 2x faster than
[R, out, in] here), a convolution's weight is [R, kh*kw*C, C'], a small sparse input (MinAtar's
observations: 1-8% ones) is convolved by scattering its nonzero pixels (a compiled kernel), a small dense
one by an unfold and one ``baddbmm``, and the output stays channels-last, so that the flatten before
the first linear layer is a free view (that layer's input rows are permuted to match). The layouts are
internal: :meth:`StackedNet.run_state` and checkpoints hold each run's parameters in ``torch.nn``'s own
layout, loadable into the plain network.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch
from numba import njit
from torch import nn

#: Converts one run's parameter between the stacked layout and torch.nn's: (to_nn, from_nn).
Layout = tuple[Callable[[torch.Tensor], torch.Tensor], Callable[[torch.Tensor], torch.Tensor]]
_SAME: Layout = (lambda t: t, lambda t: t)


class _StackedLayer(nn.Module):
    """A stacked layer whose ``weight`` is stored in its own layout: the weight carries ``perx_layout`` =
    (to_nn, from_nn), read by :meth:`StackedNet.run_state` and :class:`StackedOptimizer`."""

    def _tag(self) -> None:
        self.weight.perx_layout = (self._to_nn, self._from_nn)

    def _apply(self, fn, recurse=True):  # .to(device) may replace the parameter: it keeps its layout
        out = super()._apply(fn, recurse)
        self._tag()
        return out


class StackedLinear(_StackedLayer):
    """R linear layers: x [R, B, in] -> [R, B, out]. ``weight`` is [R, in, out]; with ``rows`` (a
    permutation of range(in)) row j of it holds nn input feature ``rows[j]``."""

    def __init__(self, layers: Sequence[nn.Linear], rows: np.ndarray | None = None) -> None:
        super().__init__()
        self.rows = None if rows is None else torch.as_tensor(rows, dtype=torch.long)
        self.inverse = None if rows is None else torch.as_tensor(np.argsort(rows), dtype=torch.long)
        self.weight = nn.Parameter(torch.stack([self._from_nn(m.weight.detach()) for m in layers]))
        self.bias = nn.Parameter(torch.stack([m.bias.detach() for m in layers]))  # [R, out]
        self._tag()

    def _from_nn(self, w: torch.Tensor) -> torch.Tensor:  # [out, in] -> [in, out]
        w = w if self.rows is None else w[:, self.rows.to(w.device)]
        return w.t().contiguous()

    def _to_nn(self, w: torch.Tensor) -> torch.Tensor:  # [in, out] -> [out, in]
        w = w.t()
        return (w if self.inverse is None else w[:, self.inverse.to(w.device)]).contiguous()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.baddbmm(self.bias.unsqueeze(1), x, self.weight)


#: Largest input map (H x W) a convolution computes by unfold + baddbmm or by scattering (on the CPU, for
#: inputs that need no gradient); larger maps, and inputs that need one, use a grouped convolution.
UNFOLD_MAX_PIXELS = 256
#: Largest fraction of nonzero inputs for which such a small map is convolved by scattering its nonzero
#: pixels into the output (cost ~ nonzeros) rather than by unfold + baddbmm (cost ~ all pixels). On one CPU,
#: 15 runs at batch 32 of a 10x10x4 map: scattering is faster at 8% nonzero, even near 12%, about four times
#: slower when dense (benchmarks/bench_stacked_nets.py times the whole network; docs/dqn.md, Lockstep).
SCATTER_MAX_DENSITY = 0.1


class StackedConv2d(_StackedLayer):
    """R convolutions: x [R, B, C, H, W] (any strides) -> [R, B, C', H', W'] (a view). ``weight`` is
    [R, kh*kw*C, C'] (rows in (kh, kw, c) order). A small float32 input on the CPU that needs no gradient
    (the observation of a MinAtar network) gives a channels-last result: for each run whose input is at
    most ``SCATTER_MAX_DENSITY`` nonzero, each nonzero pixel adds its weight rows to the outputs it reaches
    (a compiled kernel; its weight gradient likewise); the other runs' inputs are unfolded into patches
    [R, B*H'*W', kh*kw*C] (one copy) and multiplied by the weight in one ``baddbmm``. The choice is made
    per run, so that a run computes the same whichever runs share its call. Anything else runs as one
    grouped convolution (see ``UNFOLD_MAX_PIXELS``). With ``relu``, a ReLU is applied to the output."""

    def __init__(self, layers: Sequence[nn.Conv2d], relu: bool = False) -> None:
        super().__init__()
        first = layers[0]
        self.relu = relu  # apply a ReLU to the output
        if first.groups != 1 or first.dilation != (1, 1) or first.padding_mode != "zeros":
            raise TypeError(f"make: unsupported convolution {first!r} (groups, dilation or padding mode)")
        self.kernel, self.stride = first.kernel_size, first.stride
        self.pads = _pads(first.padding, first.kernel_size)  # (left, right, top, bottom), as F.pad takes them
        self._taps: dict = {}  # (H, W) -> the scatter kernel's tables (see _taps)
        self.weight = nn.Parameter(torch.stack([self._from_nn(m.weight.detach()) for m in layers]))
        self.bias = nn.Parameter(torch.stack([m.bias.detach() for m in layers]))  # [R, C']
        self._tag()

    def _from_nn(self, w: torch.Tensor) -> torch.Tensor:  # [C', C, kh, kw] -> [kh*kw*C, C']
        return w.permute(2, 3, 1, 0).reshape(-1, w.shape[0]).contiguous()

    def _to_nn(self, w: torch.Tensor) -> torch.Tensor:
        kh, kw = self.kernel
        return w.reshape(kh, kw, -1, w.shape[-1]).permute(3, 2, 0, 1).contiguous()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (not x.requires_grad and x.shape[3] * x.shape[4] <= UNFOLD_MAX_PIXELS and x.device.type == "cpu"
                and x.dtype == torch.float32 == self.weight.dtype):
            pixels = x.permute(0, 1, 3, 4, 2).contiguous()  # channels-last: a view of MinAtar's input
            flat = pixels.view(pixels.shape[0], -1).numpy()
            sparse = _nonzeros(flat) <= SCATTER_MAX_DENSITY * flat.shape[1]
            if sparse.all():
                return self._scatter(pixels, self.weight, self.bias)
            if sparse.any():  # each run takes the path its own input chooses, as it would alone
                s, d = np.flatnonzero(sparse), np.flatnonzero(~sparse)
                out = torch.cat([self._scatter(pixels[s], self.weight[s], self.bias[s]),
                                 self._dense(x[d], self.weight[d], self.bias[d])])
                return out[torch.as_tensor(np.argsort(np.concatenate([s, d])))]
        return self._dense(x, self.weight, self.bias)

    def _dense(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        (kh, kw), (sh, sw) = self.kernel, self.stride
        if any(self.pads):
            x = nn.functional.pad(x, self.pads)
        runs, batch, channels, height, width = x.shape
        if x.requires_grad or height * width > UNFOLD_MAX_PIXELS or x.device.type != "cpu":
            # one grouped convolution (oneDNN / cuDNN): faster for large maps and when the input needs a
            # gradient (Atari's 84x84 input: forward 2.5x as fast as the unfold, its inner layers 2-2.5x
            # faster forward+backward; measured: docs/dqn.md, Lockstep)
            weight = weight.view(runs, kh, kw, channels, -1).permute(0, 4, 3, 1, 2).reshape(-1, channels, kh, kw)
            out = nn.functional.conv2d(x.transpose(0, 1).reshape(batch, runs * channels, height, width), weight,
                                       bias.reshape(-1), stride=(sh, sw), groups=runs)
            out = out.view(batch, runs, -1, *out.shape[2:]).transpose(0, 1)
            return torch.relu(out) if self.relu else out
        # a small dense input map: unfold + one baddbmm, channels-last out (with its ReLU and flatten, 15 runs
        # at batch 32 of 10x10x4: forward about twice as fast as the grouped convolution, forward+backward
        # about 1.5x; docs/dqn.md, Lockstep). [R, B, C, H', W', kh, kw] -> [R, B, H', W', kh, kw, C]: views;
        # the reshape copies
        patches = x.unfold(3, kh, sh).unfold(4, kw, sw).permute(0, 1, 3, 4, 5, 6, 2)
        oh, ow = patches.shape[2:4]
        out = torch.baddbmm(bias.unsqueeze(1), patches.reshape(runs, batch * oh * ow, -1), weight)
        out = out.view(runs, batch, oh, ow, -1).permute(0, 1, 4, 2, 3)
        return torch.relu(out) if self.relu else out

    def _scatter(self, pixels: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        """The convolution of channels-last pixels [R, B, H, W, C] (contiguous float32) by scattering."""
        taps = self._taps.get(pixels.shape[2:4])
        if taps is None:
            taps = self._taps[pixels.shape[2:4]] = _taps(pixels.shape[2], pixels.shape[3], self.kernel, self.stride,
                                                         self.pads)
        if torch.is_grad_enabled() and (weight.requires_grad or bias.requires_grad):
            out = _ScatterConv.apply(weight, bias, pixels, taps, self.relu)
        else:
            out = _scatter_forward(weight.detach(), bias.detach(), pixels, taps, self.relu)
        return out.permute(0, 1, 4, 2, 3)


def _taps(height: int, width: int, kernel: tuple[int, int], stride: tuple[int, int],
          pads: tuple[int, int, int, int]) -> tuple[np.ndarray, ...]:
    """For each input row (and column): the kernel rows (columns) and output rows (columns) it meets, as
    arrays [H, kh] (and [W, kw]) with counts [H] ([W]); then the output height and width."""
    left, right, top, bottom = pads
    out, sizes = [], []
    for size, k, s, before, after in ((height, kernel[0], stride[0], top, bottom),
                                      (width, kernel[1], stride[1], left, right)):
        n_out = (size + before + after - k) // s + 1
        ks, outs, n = np.zeros((size, k), np.int64), np.zeros((size, k), np.int64), np.zeros(size, np.int64)
        for i in range(size):
            for j in range(k):  # input i sits under kernel offset j of output (i + before - j) / s
                t = i + before - j
                if t >= 0 and t % s == 0 and t // s < n_out:
                    ks[i, n[i]], outs[i, n[i]] = j, t // s
                    n[i] += 1
        out += [ks, outs, n]
        sizes.append(np.int64(n_out))  # output rows of padding alone are reached by no input
    return (*out, *sizes)


def _scatter_forward(weight: torch.Tensor, bias: torch.Tensor, pixels: torch.Tensor,
                     taps: tuple[np.ndarray, ...], relu: bool) -> torch.Tensor:
    runs, batch = pixels.shape[:2]
    out = torch.empty(runs, batch, int(taps[6]), int(taps[7]), weight.shape[-1])
    _scatter_conv(pixels.numpy(), weight.numpy(), bias.numpy(), *taps[:6], relu, out.numpy())
    return out


class _ScatterConv(torch.autograd.Function):
    """The scattered convolution (and its ReLU) with gradients for the weight and bias (the input needs
    none)."""

    @staticmethod
    def forward(ctx, weight, bias, pixels, taps, relu):
        out = _scatter_forward(weight.detach(), bias.detach(), pixels, taps, relu)
        ctx.save_for_backward(pixels, out if relu else None)
        ctx.taps = taps
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        pixels, out = ctx.saved_tensors
        runs, _, _, _, channels = pixels.shape
        kh, kw = ctx.taps[0].shape[1], ctx.taps[3].shape[1]
        dw = torch.empty(runs, kh * kw * channels, grad.shape[-1])
        db = torch.empty(runs, grad.shape[-1])
        grad = grad.contiguous().numpy()
        # through the ReLU (inside the kernel): no gradient where the output was clipped to 0
        _scatter_conv_grad(pixels.numpy(), grad, grad if out is None else out.numpy(), out is not None,
                           *ctx.taps[:6], dw.numpy(), db.numpy())
        return dw, db, None, None, None


@njit(cache=True, nogil=True)
def _nonzeros(x):  # pragma: no cover - compiled
    """The nonzero count of each row of x [R, n] (np.count_nonzero with an axis casts x to a boolean array,
    then sums it; this loop counts in one pass and vectorises)."""
    counts = np.zeros(x.shape[0], np.int64)
    for r in range(x.shape[0]):
        n = 0
        for v in x[r]:
            n += v != 0
        counts[r] = n
    return counts


@njit(cache=True, nogil=True, error_model="numpy")
def _scatter_conv(x, w, bias, hk, ho, hn, wk, wo, wn, relu, out):  # pragma: no cover - compiled
    """out[r, b, oh, ow] = bias[r] + sum of x[r, b, h, w, c] * w[r, (i*kw + j)*C + c] over the input pixels
    under each kernel offset (i, j) of that output (then max(0, .) with ``relu``): each nonzero pixel adds
    to the outputs it reaches (a zero adds nothing, even against an infinite weight)."""
    R, B, H, W, C = x.shape
    kw, co = wk.shape[1], w.shape[2]
    for r in range(R):
        wr, br = w[r], bias[r]
        for b in range(B):
            ob, xb = out[r, b], x[r, b]
            for oh in range(ob.shape[0]):
                for ow in range(ob.shape[1]):
                    for o in range(co):
                        ob[oh, ow, o] = br[o]
            for h in range(H):
                for iw in range(W):
                    for c in range(C):
                        v = xb[h, iw, c]
                        if v == 0:
                            continue
                        for a in range(hn[h]):
                            oh, i = ho[h, a], hk[h, a]
                            for e in range(wn[iw]):
                                ow, k = wo[iw, e], (i * kw + wk[iw, e]) * C + c
                                for o in range(co):
                                    ob[oh, ow, o] += v * wr[k, o]
            if relu:  # the image's outputs are still in L1
                for oh in range(ob.shape[0]):
                    for ow in range(ob.shape[1]):
                        for o in range(co):
                            ob[oh, ow, o] = max(ob[oh, ow, o], np.float32(0))


@njit(cache=True, nogil=True, error_model="numpy")
def _scatter_conv_grad(x, g, out, relu, hk, ho, hn, wk, wo, wn, dw, db):  # pragma: no cover - compiled
    """The weight and bias gradients of :func:`_scatter_conv` for the output gradient g [R, B, OH, OW, C']
    (with ``relu``, through the ReLU of the outputs ``out``)."""
    R, B, H, W, C = x.shape
    kw, co = wk.shape[1], g.shape[4]
    dw[:] = 0
    db[:] = 0
    gb = np.empty(g.shape[2:], g.dtype)  # one image's gradient before the ReLU
    for r in range(R):
        dr = dw[r]
        for b in range(B):
            xb = x[r, b]
            for oh in range(gb.shape[0]):
                for ow in range(gb.shape[1]):
                    for o in range(co):
                        gv = g[r, b, oh, ow, o]
                        if relu and not out[r, b, oh, ow, o] > 0:
                            gv = np.float32(0)
                        gb[oh, ow, o] = gv
                        db[r, o] += gv
            for h in range(H):
                for iw in range(W):
                    for c in range(C):
                        v = xb[h, iw, c]
                        if v == 0:
                            continue
                        for a in range(hn[h]):
                            oh, i = ho[h, a], hk[h, a]
                            for e in range(wn[iw]):
                                ow, k = wo[iw, e], (i * kw + wk[iw, e]) * C + c
                                for o in range(co):
                                    dr[k, o] += v * gb[oh, ow, o]


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
        channels = None  # channels of the last convolution while activations are channels-last
        rows = None  # the input-row permutation of the next linear layer (after a channels-last flatten)
        modules = list(zip(*(net for net in nets), strict=True))
        for n, parts in enumerate(modules):
            kind = parts[0]
            if isinstance(kind, nn.Linear):
                layers.append(StackedLinear(parts, rows))
                rows = None
            elif isinstance(kind, nn.Conv2d):
                # a ReLU right after a convolution runs inside it (the scatter kernel applies it in place);
                # an Identity keeps its index, so parameter names stay torch.nn's
                relu = n + 1 < len(modules) and isinstance(modules[n + 1][0], nn.ReLU)
                layers.append(StackedConv2d(parts, relu=relu))
                channels = kind.out_channels
            elif isinstance(kind, nn.ReLU) and n > 0 and isinstance(modules[n - 1][0], nn.Conv2d):
                layers.append(nn.Identity())
            elif isinstance(kind, nn.ReLU | nn.Tanh):
                layers.append(type(kind)())
            elif isinstance(kind, nn.Flatten):
                if (kind.start_dim, kind.end_dim) != (1, -1):
                    raise TypeError(f"make: only nn.Flatten() of every feature dimension is supported, got {kind!r}")
                # after a convolution, flatten in (h, w, c) order (a view) and permute the next Linear's rows
                # to match; without such a Linear, flatten in torch's (c, h, w) order (a copy)
                linear = _next_linear(nets[0], kind) if channels is not None else None
                layers.append(_FlattenRuns(channels_last=linear is not None))
                if linear is not None:
                    rows = _channels_last_rows(channels, linear.in_features)
                channels = None
            else:
                raise TypeError(f"make: unsupported layer {kind!r}")
        self.layers = nn.Sequential(*layers)
        self.runs = len(seeds)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [R, B, ...] -> [R, B, outputs]."""
        return self.layers(x)

    def layouts(self) -> list[Layout]:
        """(to_nn, from_nn) of each parameter, in the order of ``parameters()``."""
        return list(self._layouts().values())

    def _layouts(self) -> dict[str, Layout]:
        return {k: getattr(p, "perx_layout", _SAME) for k, p in self.named_parameters()}

    def run_state(self, r: int) -> dict[str, torch.Tensor]:
        """Run r's parameters (copies), each in torch.nn's layout."""
        lay = self._layouts()
        return {k: lay.get(k, _SAME)[0](v[r].detach()).clone() for k, v in self.state_dict().items()}

    def load_run_state(self, r: int, state: dict[str, torch.Tensor]) -> None:
        """Set run r's parameters from ``state`` in torch.nn's layout (as :meth:`run_state` returns)."""
        lay = self._layouts()
        with torch.no_grad():
            for k, v in self.state_dict().items():
                v[r].copy_(lay.get(k, _SAME)[1](state[k].to(v.device)))


def _pads(padding: str | tuple[int, int], kernel: tuple[int, int]) -> tuple[int, int, int, int]:
    """Conv2d's padding as (left, right, top, bottom); "same" puts an odd extra pixel after, as torch does."""
    if padding == "valid":
        return (0, 0, 0, 0)
    if padding == "same":
        (kh, kw) = kernel
        return (kw - 1) // 2, kw - 1 - (kw - 1) // 2, (kh - 1) // 2, kh - 1 - (kh - 1) // 2
    ph, pw = padding
    return pw, pw, ph, ph


def _next_linear(net: nn.Sequential, flatten: nn.Flatten) -> nn.Linear | None:
    """The first Linear after ``flatten`` with only ReLU/Tanh between; None otherwise (another layer, or the
    end of the network, comes first)."""
    found = False
    for m in net:
        if m is flatten:
            found = True
        elif found and isinstance(m, nn.Linear):
            return m
        elif found and not isinstance(m, nn.ReLU | nn.Tanh):
            return None
    return None


def _channels_last_rows(channels: int, features: int) -> np.ndarray:
    """nn's flatten order is (c, h, w); a channels-last flatten gives (h, w, c): row j = hw * C + c of
    the stacked weight holds nn feature c * HW + hw."""
    hw = np.arange(features // channels)
    c = np.arange(channels)
    return (c[None, :] * len(hw) + hw[:, None]).reshape(-1)


class _FlattenRuns(nn.Module):
    def __init__(self, channels_last: bool = False) -> None:
        super().__init__()
        self.channels_last = channels_last

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.channels_last:  # [R, B, C, H, W] stored channels-last -> [R, B, H*W*C]: a view
            return x.permute(0, 1, 3, 4, 2).flatten(2)
        return x.flatten(2)


# error_model='numpy': no zero-division branch per element, so the loop vectorises (measured 4x faster)
@njit(cache=True, nogil=True, error_model="numpy")
def _rmsprop(p, g, m, v, lr, alpha, eps, centered):  # pragma: no cover - compiled
    a = np.float32(alpha)
    b = np.float32(1.0 - alpha)
    e = np.float32(eps)
    for r in range(p.shape[0]):
        step = lr[r]
        for i in range(p.shape[1]):
            gi = g[r, i]
            vi = v[r, i] * a + b * (gi * gi)
            v[r, i] = vi
            if centered:
                mi = m[r, i] * a + b * gi
                m[r, i] = mi
                vi = vi - mi * mi
            p[r, i] -= (gi * step) / (np.sqrt(vi) + e)


@njit(cache=True, nogil=True, error_model="numpy")
def _adam(p, g, m, v, lr, beta1, beta2, eps, bias1, bias2):  # pragma: no cover - compiled
    b1, c1 = np.float32(beta1), np.float32(1.0 - beta1)
    b2, c2 = np.float32(beta2), np.float32(1.0 - beta2)
    e, d2 = np.float32(eps), np.float32(bias2)
    for r in range(p.shape[0]):
        step = np.float32(lr[r] / bias1)
        for i in range(p.shape[1]):
            gi = g[r, i]
            mi = m[r, i] * b1 + c1 * gi
            vi = v[r, i] * b2 + c2 * (gi * gi)
            m[r, i] = mi
            v[r, i] = vi
            p[r, i] -= (mi * step) / (np.sqrt(vi / d2) + e)


class StackedOptimizer:
    """Adam (``"adam"``) or centered RMSprop (``"rmsprop"``, torch's formula) for stacked parameters,
    with a step size per run (``lr``: float tensor [R]). Elementwise, so it is exactly one optimiser per
    run; tests compare it with ``torch.optim`` run by run. On the CPU (float32, contiguous) a step is one
    compiled pass over each parameter, its gradient and its two moments; elsewhere torch operations.
    :meth:`run_state` gives the moments in torch.nn's layout: ``layouts`` (``StackedNet.layouts()``), by
    default the layout each stacked parameter carries."""

    def __init__(self, params: Sequence[torch.Tensor], lr: torch.Tensor, kind: str = "adam", *,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8, alpha: float = 0.95,
                 centered: bool = True, layouts: Sequence[Layout] | None = None) -> None:
        if kind not in ("adam", "rmsprop"):
            raise ValueError(f"kind: 'adam' or 'rmsprop', got {kind!r}")
        self.params = list(params)
        if layouts is not None and len(layouts) != len(self.params):
            raise ValueError(f"layouts: one per parameter ({len(self.params)}), got {len(layouts)}")
        if layouts is None:  # each stacked weight carries its own (StackedLinear, StackedConv2d)
            layouts = [getattr(p, "perx_layout", _SAME) for p in self.params]
        self.layouts = list(layouts)
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
        lr32 = None
        for p, st in zip(self.params, self.state, strict=True):
            if p.grad is None:
                continue
            g, m, v = p.grad, st["m"], st["v"]
            if _compiled(p, g, m, v):
                if lr32 is None:
                    lr32 = self.lr.detach().to("cpu", torch.float32).numpy()
                flat = [t.view(p.shape[0], -1).numpy() for t in (p, g, m, v)]
                if self.kind == "adam":
                    b1, b2 = self.betas
                    _adam(*flat, lr32, b1, b2, self.eps, 1 - b1**self.steps, 1 - b2**self.steps)
                else:
                    _rmsprop(*flat, lr32, self.alpha, self.eps, self.centered)
                # written through numpy: tell autograd, so that a graph that saved p refuses to run backward
                torch.autograd.graph.increment_version(p)
                continue
            lr = self.lr.reshape(-1, *([1] * (p.dim() - 1)))  # [R, 1, ...]: a step size per run
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
        """Run r's step count and moments (copies, in torch.nn's layout)."""
        pairs = list(zip(self.state, self.layouts, strict=True))
        return {"steps": self.steps, "m": [lay[0](s["m"][r]).clone() for s, lay in pairs],
                "v": [lay[0](s["v"][r]).clone() for s, lay in pairs]}

    def load_run_state(self, r: int, state: dict) -> None:
        self.steps = int(state["steps"])
        for s, lay, m, v in zip(self.state, self.layouts, state["m"], state["v"], strict=True):
            s["m"][r].copy_(lay[1](m.to(s["m"].device)))
            s["v"][r].copy_(lay[1](v.to(s["v"].device)))


def _compiled(*tensors: torch.Tensor) -> bool:
    return all(t.device.type == "cpu" and t.dtype == torch.float32 and t.is_contiguous() for t in tensors)


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
