"""Two measurements behind docs/supervised.md's reading of the MNIST-1D study (issue 41, item 3).

1. prioritized (alpha = 1, beta = 0, step size 0.03): the share of rare digits (0-4) in the sampled batches,
   per 1,000 updates, against their 1% share of the training set (000 Sec. 6's hypothesis: rare samples are
   drawn disproportionately often because their errors shrink less fast).
2. prioritized-is (beta = 1, step size 0.3): the mean IS weight of a batch (buffer-wide max normalisation, as
   the study ran it) and what normalising by the batch maximum instead would give.

Same data, sampler, network and update as `perx supervised --data mnist1d`, seed 0 (one run each, ~2 min):
`python results/supervised-mnist1d/diagnostics.py > results/supervised-mnist1d/diagnostics.txt`
"""
import numpy as np
import torch

import perx
from perx.experiments import supervised as S


def main() -> None:
    torch.set_num_threads(1)
    data = S.load_split(S.Config(data="mnist1d"))
    x, y = data["x_train"], data["y_train"]
    rare = list(S.RARE)
    print(f"training set: {len(y)} examples, rare share {np.isin(y, rare).mean():.4f}")
    for method, lr, beta in (("prioritized", 0.03, 0.0), ("prioritized-is", 0.3, 1.0)):
        buf = perx.ReplayBuffer(len(y), S._sampler(method), seed=1000 * S.METHODS.index(method))
        buf.extend(x=x, y=y)
        net = S.network(0, "mnist1d")
        opt = torch.optim.SGD(net.parameters(), lr=lr)
        shares, weights, batch_norm = [], [], []
        for update in range(1, 4001):
            batch = buf.sample(60, beta=beta)
            shares.append(np.isin(batch["y"], rare).mean())
            w = batch.weights
            weights.append(w.mean())
            batch_norm.append((w / w.max()).mean())
            per_example = torch.nn.functional.nll_loss(net(torch.from_numpy(batch["x"])), torch.from_numpy(batch["y"]),
                                                       reduction="none")
            loss = (per_example * torch.from_numpy(w.astype(np.float32))).mean() if beta > 0 else per_example.mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            buf.update_priorities(batch.indices, per_example.detach().numpy().astype(np.float64))
            if update % 1000 == 0:
                s = slice(update - 1000, update)
                line = f"{method} lr {lr}: updates {update - 999}-{update}: rare share {np.mean(shares[s]):.3f}"
                if beta > 0:
                    line += (f", mean IS weight {np.mean(weights[s]):.2e} (buffer max), "
                             f"{np.mean(batch_norm[s]):.3f} (if normalised by the batch max)")
                print(line, flush=True)


if __name__ == "__main__":
    main()
