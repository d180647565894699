"""Blind Cliffwalk: updates to learn the value function against memory size (000 Sec. 3.1-3.3, Fig. 1-2).

Setup (000 App. B.1): the replay memory holds every transition of all 2^n action sequences, executed
until termination in random order (2^(n+1) - 2 transitions, one of them rewarded). Q-learning with
Q(s, a) = theta^T phi(s, a) -- tabular (one-hot over (s, a)) or linear (by default a block [one-hot(s), 1]
per action, so no weight is shared across actions: B.1's "to make generalization across actions impossible";
``bias="shared"`` reads it as one bias feature for both actions) -- theta_i ~ N(0, 0.1) (read as standard
deviation 0.1), gamma = 1 - 1/n, step size
eta = 1/4, one transition per update:

    delta = R + gamma_t max_a Q(S', a) - Q(S, A)        (eq. 2; gamma_t = 0 at termination)
    theta <- theta + eta * w * delta * phi(S, A)          (eq. 3; w = IS weight, or 1)

Convergence: mean squared error between Q and the ground truth over all 2n (s, a) pairs below 1e-3.
The measurement is the number of updates to convergence.

Strategies (every sampled one goes through a perx sampler; priorities are set to |delta| of the update):
  uniform-*            perx.Uniform
  greedy-tabular       perx.Greedy (the transition with the largest stored |delta|)
  rank-linear[-is]     perx.RankBased(alpha_rank, segments=32), without / with IS weights (beta = 1)
  proportional-linear[-is]  perx.Proportional(alpha_prop), without / with IS weights (beta = 1)
  oracle-*             the hindsight oracle of Figure 1: at each step the transition whose update most
                       reduces the global loss (the MSE to the ground truth), found by trying every
                       candidate. Transitions with the same (s, a) are identical in this deterministic
                       chain and give identical updates, so the 2n distinct ones are tried (tests check this
                       equals trying every stored transition). The literal oracle *stalls* when every
                       candidate raises the loss: the run stops there and is reported as stalled.
  oracle-lookahead-*   documented variant: when no single update lowers the loss, apply the sequence of
                       up to LOOKAHEAD_DEPTH = 2 updates that reaches the lowest loss, if that is below the
                       current loss (each update counted); the loss still falls at every step taken, so the
                       variant cannot cycle. If no such sequence exists it stalls too.
  oracle-twostep-linear  the always-two-step reading of the oracle: at every step the transition whose
                       two-update sequence (it, then the best follow-up) reaches the lowest global loss; only
                       that first update is applied and the search starts again (receding horizon). Stalls
                       when no two-update sequence lowers the loss.

Runs are capped at ``cap_factor`` x memory size updates (the oracles at ``oracle_cap_factor`` x); a capped
run is reported as such, never silently truncated. The learners and the oracle's candidate search are
compiled (numba); every draw still goes through a perx sampler (uniform draws in chunks of 4096: they do not
depend on what was learned). Defaults: n = 2..16, the -is variants to n = 11. Results go to ``--out`` (default
``runs/cliffwalk``, which git ignores; ``--out results/cliffwalk`` regenerates the committed study): ``runs.csv``
(one row per method, n, seed, appended as each run finishes; ``--resume`` continues an interrupted study from it),
``summary.csv``, ``meta.json`` and ``cliffwalk.png``.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
from numba import njit

import perx
import perx.host
from perx.envs import BlindCliffwalk
from perx.experiments._cliffwalk_learner import CONVERGED_MSE, ETA, Learner, _mse, _qv
from perx.experiments._pool import run_jobs

LOOKAHEAD_DEPTH = 2
#: Uniform draws per sample call (see run_one).
UNIFORM_CHUNK = 4096

METHODS = (
    "uniform-tabular", "greedy-tabular", "oracle-tabular",
    "uniform-linear", "rank-linear", "rank-linear-is", "proportional-linear", "proportional-linear-is",
    "oracle-linear", "oracle-lookahead-linear", "oracle-twostep-linear",
)


@dataclass(frozen=True)
class Config:
    n_min: int = 2
    """Smallest chain."""
    n_max: int = 16
    """Largest chain (memory 2^(n+1) - 2; 131,070 at n = 16, as in 000 Figures 1-2)."""
    n_max_is: int = 11
    """Largest chain for the IS variants (-is): full IS correction makes them need 30-50x the memory in
    updates (docs/cliffwalk.md), about 100 s per run at n = 16."""
    seeds: int = 10
    """Independent runs per (method, n), as in the paper's figures."""
    methods: tuple[str, ...] = field(default=METHODS)
    """Strategies to run."""
    alpha_rank: float = 0.7
    """Rank-based exponent (000 Table 3's tuned value for rank-based Double DQN)."""
    alpha_prop: float = 0.6
    """Proportional exponent (000 Table 3's tuned value for proportional Double DQN)."""
    rank_segments: int = 32
    """Equal-probability segments of the rank-based sampler (one is picked per single-transition draw)."""
    cap_factor: int = 50
    """Cap on updates per run, in multiples of the memory size (uniform needs about 13-14x)."""
    oracle_cap_factor: int = 2
    """Cap on the oracles' updates, in multiples of the memory size, and at least 20,000 (a converging
    oracle needs under 7,000 at every n measured)."""
    bias: str = "per-action"
    """Linear representation: a block [one-hot(s), 1] per action ("per-action", App. B.1: "to make
    generalization across actions impossible"), or one bias feature shared by both actions ("shared")."""


@njit(cache=True)
def _type_update(theta, bias_of, linear, gamma, t, r, s2, term):
    """Apply the update of transition type t = 2s + a (reward r, next state s2) to theta in place."""
    target = r
    if not term:
        target += gamma * max(_qv(theta, bias_of, linear, 2 * s2), _qv(theta, bias_of, linear, 2 * s2 + 1))
    step = ETA * (target - _qv(theta, bias_of, linear, t))
    theta[t] += step
    if linear:
        theta[bias_of[t]] += step


@njit(cache=True)
def _best_pair(theta, one, two, bias_of, qstar, linear, gamma, types, r, s2, term):
    """(lowest MSE to Q*, k, k2) over every sequence of two candidate updates from theta (the first in type
    order on ties); ``one`` and ``two`` are scratch arrays shaped like theta. O(c^2 m)."""
    c = types.shape[0]
    best, first, second = np.inf, -1, -1
    for k in range(c):
        one[:] = theta
        _type_update(one, bias_of, linear, gamma, types[k], r[k], s2[k], term[k])
        for k2 in range(c):
            two[:] = one
            _type_update(two, bias_of, linear, gamma, types[k2], r[k2], s2[k2], term[k2])
            loss = _mse(two, bias_of, qstar, linear)
            if loss < best:
                best, first, second = loss, k, k2
    return best, first, second


@njit(cache=True)
def _oracle_run(theta, bias_of, qstar, linear, gamma, types, r, s2, term, depth, cap, threshold):
    """The hindsight oracle in one compiled loop: at each step apply the candidate type whose update lowers
    the MSE to Q* most (strictly; the first in type order on ties); if none lowers it and depth = 2, the
    best sequence of two updates, if that lowers it; else stop (stalled). Returns (updates, MSE, stalled).
    A step costs O(c m) with c = 2n candidates and m = 2n Q-values; a two-update search O(c^2 m)."""
    c = types.shape[0]
    one = np.empty_like(theta)
    two = np.empty_like(theta)
    mse = _mse(theta, bias_of, qstar, linear)
    updates = 0
    while mse >= threshold and updates < cap:
        best, pick = np.inf, -1
        for k in range(c):
            one[:] = theta
            _type_update(one, bias_of, linear, gamma, types[k], r[k], s2[k], term[k])
            loss = _mse(one, bias_of, qstar, linear)
            if loss < best:
                best, pick = loss, k
        if best < mse:
            _type_update(theta, bias_of, linear, gamma, types[pick], r[pick], s2[pick], term[pick])
            updates += 1
            mse = _mse(theta, bias_of, qstar, linear)
            continue
        if depth < 2:
            return updates, mse, True
        best2, first, second = _best_pair(theta, one, two, bias_of, qstar, linear, gamma, types, r, s2, term)
        if not best2 < mse:
            return updates, mse, True
        _type_update(theta, bias_of, linear, gamma, types[first], r[first], s2[first], term[first])
        updates += 1
        if updates < cap:
            _type_update(theta, bias_of, linear, gamma, types[second], r[second], s2[second], term[second])
            updates += 1
        mse = _mse(theta, bias_of, qstar, linear)
    return updates, mse, False


@njit(cache=True)
def _oracle_twostep_run(theta, bias_of, qstar, linear, gamma, types, r, s2, term, cap, threshold):
    """The always-two-step oracle (receding horizon): at each step search every sequence of two updates
    (k, k2), apply the first update k of the one that reaches the lowest MSE to Q* (the first in type order on
    ties), count it, and search again; stop when no sequence lowers the MSE (stalled). Returns (updates, MSE,
    stalled). A step costs O(c^2 m) with c = 2n candidates and m = 2n Q-values."""
    one = np.empty_like(theta)
    two = np.empty_like(theta)
    mse = _mse(theta, bias_of, qstar, linear)
    updates = 0
    while mse >= threshold and updates < cap:
        best, first, _ = _best_pair(theta, one, two, bias_of, qstar, linear, gamma, types, r, s2, term)
        if not best < mse:
            return updates, mse, True
        _type_update(theta, bias_of, linear, gamma, types[first], r[first], s2[first], term[first])
        updates += 1
        mse = _mse(theta, bias_of, qstar, linear)
    return updates, mse, False


# -- the oracle -----------------------------------------------------------------------------------------

class Oracle:
    """Evaluates, for every distinct transition type c = (s, a), the global loss after its update."""

    def __init__(self, learner: Learner, memory: dict[str, np.ndarray]) -> None:
        self.L = learner
        key = memory["obs"] * 2 + memory["action"]
        types, first = np.unique(key, return_index=True)
        self.types = types  # index 2s + a
        self.r = memory["reward"][first]
        self.s2 = memory["next_obs"][first]
        self.term = memory["terminated"][first]

    def _deltas(self, q: np.ndarray) -> np.ndarray:
        """TD errors of every type under Q-values ``q`` (shape [..., m])."""
        qmax = np.maximum(q[..., 0::2], q[..., 1::2])  # [..., n]
        boot = np.where(self.term, 0.0, self.L.gamma * qmax[..., self.s2])
        return self.r + boot - q[..., self.types]

    def _after(self, q: np.ndarray, steps: np.ndarray) -> np.ndarray:
        """Q-values after each candidate's update: [..., c, m] from q [..., m] and steps [..., c]."""
        m = self.L.m
        c = np.arange(len(self.types))
        move = np.zeros((len(self.types), m))
        move[c, self.types] = 1.0
        if self.L.linear:
            # a candidate's bias weight moves every Q-value that shares it
            move += self.L.bias_of[None, :] == self.L.bias_of[self.types][:, None]
        return q[..., None, :] + move * steps[..., None]

    def best_sequence(self, depth: int) -> tuple[float, list[int]]:
        """The lowest global loss reachable with 1..depth updates, and that sequence (type indices)."""
        q = self.L.q()[None, :]
        paths: list[list[int]] = [[]]
        best: tuple[float, list[int]] = (np.inf, [])
        for _ in range(depth):
            q_next = self._after(q, ETA * self._deltas(q))  # [paths, c, m]
            e = q_next - self.L.qstar
            loss = (e * e).mean(axis=-1)
            p, c = np.unravel_index(int(np.argmin(loss)), loss.shape)
            if loss[p, c] < best[0]:
                best = (float(loss[p, c]), [*paths[p], int(c)])
            q = q_next.reshape(-1, self.L.m)
            paths = [[*path, c] for path in paths for c in range(loss.shape[1])]
        return best

    def run(self, depth: int, cap: int) -> tuple[int, float, bool]:
        """The compiled oracle loop (:func:`_oracle_run`) until convergence, a stall or ``cap`` updates:
        (updates, final MSE, stalled). depth 1 or 2."""
        L = self.L
        return _oracle_run(L.theta, L.bias_of, L.qstar, L.linear, L.gamma, self.types, self.r, self.s2,
                           self.term, depth, cap, CONVERGED_MSE)

    def run_twostep(self, cap: int) -> tuple[int, float, bool]:
        """The always-two-step oracle (:func:`_oracle_twostep_run`): (updates, final MSE, stalled)."""
        L = self.L
        return _oracle_twostep_run(L.theta, L.bias_of, L.qstar, L.linear, L.gamma, self.types, self.r, self.s2,
                                   self.term, cap, CONVERGED_MSE)

    def apply(self, c: int) -> None:
        """Update on candidate type index c with its current TD error."""
        delta = float(self._deltas(self.L.q())[c])
        t = int(self.types[c])
        self.L.update(t // 2, t % 2, delta)


# -- one run ------------------------------------------------------------------------------------------------

def representation(method: str) -> str:
    """'tabular' or 'linear' (method names are <strategy>-<representation>[-is])."""
    return "linear" if "-linear" in method else "tabular"


def _sampler(method: str, cfg: Config):
    if method.startswith("uniform"):
        return perx.Uniform()
    if method.startswith("greedy"):
        return perx.Greedy()
    if method.startswith("rank"):
        # IS weights normalised by the buffer-wide maximum (000 Sec. 3.4), as the committed study ran them
        return perx.RankBased(alpha=cfg.alpha_rank, segments=cfg.rank_segments, normalize="buffer")
    if method.startswith("proportional"):
        return perx.Proportional(alpha=cfg.alpha_prop, normalize="buffer")
    raise ValueError(f"method: unknown {method!r}")


def run_one(method: str, n: int, seed: int, cfg: Config) -> dict:
    """Updates to convergence for one (method, n, seed). Memory order and initial theta depend only on
    (seed, n), so every method starts from the same memory and the same parameters for a seed."""
    if method not in METHODS:
        raise ValueError(f"method: must be one of {METHODS}, got {method!r}")
    linear = representation(method) == "linear"
    streams = np.random.SeedSequence([seed, n]).spawn(3)
    env = BlindCliffwalk(n, seed=np.random.default_rng(streams[0]).integers(2**63))
    memory = env.replay_memory()
    size = len(memory["obs"])
    learner = Learner(env, linear, np.random.default_rng(streams[1]), cfg.bias)
    cap = max(1000, cfg.cap_factor * size)
    t0 = time.perf_counter()
    updates, stalled = 0, False
    mse = learner.mse()
    if method.startswith("oracle"):
        oracle = Oracle(learner, memory)
        cap = max(20_000, cfg.oracle_cap_factor * size)
        if "twostep" in method:
            updates, mse, stalled = oracle.run_twostep(cap)
        else:
            updates, mse, stalled = oracle.run(LOOKAHEAD_DEPTH if "lookahead" in method else 1, cap)
    else:
        method_seed = int(np.random.default_rng(streams[2]).integers(2**63)) + METHODS.index(method)
        buf = perx.ReplayBuffer(size, _sampler(method, cfg), seed=method_seed)
        buf.extend(**memory)
        use_is = method.endswith("-is")
        beta = 1.0 if use_is else 0.0
        # Uniform draws do not depend on what was learned, so they are drawn in chunks (the same i.i.d.
        # distribution, far fewer calls) and learned from until convergence; prioritized draws depend on
        # the last update's priority, so those are drawn one at a time.
        chunk = UNIFORM_CHUNK if method.startswith("uniform") else 1
        ones = np.ones(chunk)
        deltas = np.empty(chunk)
        while mse >= CONVERGED_MSE and updates < cap:
            batch = buf.sample(min(chunk, cap - updates), beta=beta)
            w = batch.weights if use_is else ones
            done, mse = learner.learn(batch["obs"], batch["action"], batch["reward"], batch["next_obs"],
                                      batch["terminated"], w, deltas)
            if chunk == 1:
                buf.update_priorities(batch.indices, deltas)
            updates += done
    converged = mse < CONVERGED_MSE
    return {"method": method, "n": n, "memory_size": size, "seed": seed, "updates": updates,
            "converged": converged, "stalled": stalled, "hit_cap": (not converged and not stalled),
            "cap": cap, "final_mse": mse, "seconds": round(time.perf_counter() - t0, 3)}


def _run_job(args: tuple[str, int, int, Config]) -> dict:
    return run_one(*args)


# -- the study ------------------------------------------------------------------------------------------------

FIELDS = ["method", "n", "memory_size", "seed", "updates", "converged", "stalled", "hit_cap", "cap", "final_mse",
          "seconds"]


def read_runs(path: Path) -> list[dict]:
    if not path.exists():
        return []
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        for key in ("n", "memory_size", "seed", "updates", "cap"):
            r[key] = int(r[key])
        for key in ("converged", "stalled", "hit_cap"):
            r[key] = r[key] == "True"
        r["final_mse"] = float(r["final_mse"])
        r["seconds"] = float(r["seconds"])
    return rows


def summarize(rows: list[dict]) -> list[dict]:
    out = []
    keys = sorted({(r["method"], r["n"]) for r in rows}, key=lambda k: (METHODS.index(k[0]), k[1]))
    for method, n in keys:
        sel = [r for r in rows if r["method"] == method and r["n"] == n]
        ups = np.array([r["updates"] for r in sel])
        # a run that stalled or hit the cap has no update count to convergence: it counts as infinite,
        # so the median is finite only if at least half of the runs converged
        to_conv = np.array([r["updates"] if r["converged"] else np.inf for r in sel])
        out.append({"method": method, "n": n, "memory_size": sel[0]["memory_size"], "runs": len(sel),
                    "converged": sum(r["converged"] for r in sel), "stalled": sum(r["stalled"] for r in sel),
                    "hit_cap": sum(r["hit_cap"] for r in sel), "median_updates": float(np.median(to_conv)),
                    "min_updates": float(to_conv.min()), "max_updates": float(to_conv.max()),
                    "median_updates_at_stop": float(np.median(ups))})
    return out


STYLE = {
    "uniform": ("black", "o"), "greedy": ("tab:red", "s"), "oracle": ("tab:cyan", "D"),
    "oracle-lookahead": ("tab:green", "v"), "oracle-twostep": ("darkgreen", "P"),
    "rank": ("tab:red", "s"), "rank-is": ("salmon", "s"),
    "proportional": ("tab:blue", "^"), "proportional-is": ("lightsteelblue", "^"),
}


def _why_not(summary: list[dict], method: str, rep: str) -> str:
    """Strip label: the method and whether its runs that did not converge stalled, hit the cap, or both."""
    rows = [s for s in summary if s["method"] == method]
    stalled, capped = sum(s["stalled"] for s in rows), sum(s["hit_cap"] for s in rows)
    why = "stalled" if not capped else "hit the cap" if not stalled else "stalled / hit the cap"
    return f"{method.replace(f'-{rep}', '')}\n({why})"


def plot(summary: list[dict], path: Path) -> None:
    """Medians where more than half of the runs converged; runs that did not converge are marked, with their
    count, in a strip above each panel, never drawn at the update count where they stopped (a stall stops
    early, so that count would sit below the converged runs and read as faster)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    seeds = max(s["runs"] for s in summary)
    failing = [m for m in METHODS if any(s["method"] == m and s["converged"] < s["runs"] for s in summary)]
    fig, axes = plt.subplots(2, 2, figsize=(12, 8), sharex="col", gridspec_kw={"height_ratios": [1.4, 6]})
    axes[1, 1].sharey(axes[1, 0])
    for col, rep, title in ((0, "tabular", "Tabular (000 Fig. 2 left)"),
                            (1, "linear", "Linear function approximation (000 Fig. 2 right)")):
        strip, ax = axes[0, col], axes[1, col]
        rows_here = [m for m in failing if representation(m) == rep]
        for method in METHODS:
            rows = [s for s in summary if s["method"] == method]
            if representation(method) != rep or not rows:
                continue
            base = method.replace(f"-{rep}", "")
            color, marker = STYLE.get(base, ("gray", "x"))
            x = np.array([r["memory_size"] for r in rows])
            med = np.array([r["median_updates"] for r in rows])
            # summarize() counts a run that did not converge as infinite, so the median is finite only
            # where more than half of the runs converged: the curve is drawn there only
            ok = np.isfinite(med)
            if ok.any():
                ax.plot(x[ok], med[ok], color=color, marker=marker, label=base, lw=1.8, ms=4)
                for key in ("min_updates", "max_updates"):
                    y = np.array([r[key] for r in rows])
                    ax.plot(x[ok & np.isfinite(y)], y[ok & np.isfinite(y)], color=color, lw=0.7, alpha=0.35)
            if method in rows_here:
                fails = np.array([r["runs"] - r["converged"] for r in rows])
                hit = fails > 0
                y_row = len(rows_here) - 1 - rows_here.index(method)  # first failing method on top
                strip.plot(x[hit], np.full(hit.sum(), y_row), ls="none", marker="X", ms=7, color=color,
                           mec="black", mew=0.5)
                for xi, k in zip(x[hit], fails[hit], strict=True):
                    strip.annotate(str(k), (xi, y_row), xytext=(0, 5), textcoords="offset points", ha="center",
                                   va="bottom", fontsize=6.5)
        strip.set_title(title, fontsize=10)
        strip.set_ylim(-0.6, max(1, len(rows_here)) + 0.25)  # room for the counts and the note on top
        strip.set_yticks(range(len(rows_here)), [_why_not(summary, m, rep) for m in reversed(rows_here)],
                         fontsize=7)
        strip.tick_params(axis="x", which="both", bottom=False)
        strip.grid(alpha=0.3, axis="x", which="major")
        strip.text(0.01, 0.97, f"X: runs that did not converge; number: how many of the {seeds}"
                   if rows_here else f"did not converge: none (all {seeds} runs converged at every size)",
                   transform=strip.transAxes, fontsize=7, color="dimgray", va="top")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("memory size (transitions)")
        ax.grid(alpha=0.3, which="both")
        handles, labels = ax.get_legend_handles_labels()
        if handles:  # below the axes: a legend inside would cover curves
            ax.legend(handles, labels, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=3,
                      frameon=False)
    axes[1, 0].set_ylabel(f"updates to convergence\n(median of {seeds}, drawn where more than half converged;"
                          " faint: min, max)", fontsize=9)
    fig.suptitle("Blind Cliffwalk: updates until the MSE to the true Q-values is below 1e-3", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_outputs(rows: list[dict], out: Path, cfg: Config, command: str) -> list[dict]:
    summary = summarize(rows)
    with open(out / "summary.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(summary[0]))
        writer.writeheader()
        writer.writerows(summary)
    plot(summary, out / "cliffwalk.png")
    return summary


#: Where ``perx cliffwalk`` writes unless ``--out`` says otherwise: a folder git ignores, so an interrupted run
#: never touches the committed study (``--out results/cliffwalk`` regenerates that one).
DEFAULT_OUT = "runs/cliffwalk"


def build_parser(prog: str = "perx cliffwalk") -> argparse.ArgumentParser:
    d = Config()
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument("--n-min", type=int, default=d.n_min)
    parser.add_argument("--n-max", type=int, default=d.n_max, help="largest chain; memory 2^(n+1) - 2")
    parser.add_argument("--n-max-is", type=int, default=d.n_max_is, help="largest chain for the -is methods")
    parser.add_argument("--seeds", type=int, default=d.seeds)
    parser.add_argument("--methods", nargs="+", default=list(d.methods), choices=METHODS)
    parser.add_argument("--alpha-rank", type=float, default=d.alpha_rank)
    parser.add_argument("--alpha-prop", type=float, default=d.alpha_prop)
    parser.add_argument("--rank-segments", type=int, default=d.rank_segments)
    parser.add_argument("--cap-factor", type=int, default=d.cap_factor, help="cap = this x memory size updates")
    parser.add_argument("--oracle-cap-factor", type=int, default=d.oracle_cap_factor,
                        help="the oracles' cap, x memory size")
    parser.add_argument("--bias", choices=("shared", "per-action"), default=d.bias,
                        help="bias feature of the linear representation")
    parser.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1), help="processes")
    parser.add_argument("--out", default=DEFAULT_OUT,
                        help="folder for runs.csv, summary.csv, PNG, meta (default: %(default)s, which git ignores; "
                             "results/cliffwalk is the committed study)")
    parser.add_argument("--resume", action="store_true",
                        help="keep the runs already in OUT/runs.csv and run only the missing ones")
    parser.add_argument("--plot-only", action="store_true",
                        help="redraw OUT/summary.csv and the PNG from OUT/runs.csv (no runs)")
    return parser


def main(argv: list[str] | None = None, prog: str = "perx cliffwalk") -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser(prog).parse_args(argv)
    cfg = Config(n_min=args.n_min, n_max=args.n_max, n_max_is=args.n_max_is, seeds=args.seeds,
                 methods=tuple(args.methods), alpha_rank=args.alpha_rank, alpha_prop=args.alpha_prop,
                 rank_segments=args.rank_segments, cap_factor=args.cap_factor,
                 oracle_cap_factor=args.oracle_cap_factor, bias=args.bias)
    out = Path(args.out)
    runs_path = out / "runs.csv"
    command = " ".join([prog, *argv])
    if args.plot_only:  # reads and writes OUT only, and creates nothing when OUT holds no runs
        rows = read_runs(runs_path)
        if not rows:
            hint = " (the committed study: --out results/cliffwalk)" if args.out == DEFAULT_OUT else ""
            print(f"perx cliffwalk: no runs in {runs_path}{hint}", file=sys.stderr)
            return 1
        print_table(write_outputs(rows, out, cfg, command))
        print(f"wrote {out}/summary.csv, cliffwalk.png from {len(rows)} runs in {runs_path}")
        return 0
    out.mkdir(parents=True, exist_ok=True)
    meta_path = out / "meta.json"
    learning = {k: v for k, v in asdict(cfg).items()
                if k in ("alpha_rank", "alpha_prop", "rank_segments", "cap_factor", "oracle_cap_factor", "bias")}
    if not args.resume and runs_path.exists():
        runs_path.unlink()  # a plain run starts over; --resume continues an interrupted study
    rows = read_runs(runs_path)
    if rows and meta_path.exists():
        old = json.loads(meta_path.read_text()).get("learning")
        if old != learning:
            print(f"perx cliffwalk: {runs_path} was made with {old}, not {learning}; drop --resume or use another "
                  "--out", file=sys.stderr)
            return 2
    meta = {"command": command, "learning": learning, "config": asdict(cfg), "perx": perx.__version__,
            "numpy": np.__version__, "python": platform.python_version(),
            # the oracle rows depend on the host's rounding (numba compiles for it): docs/cliffwalk.md
            "host": perx.host.describe()}
    meta_path.write_text(json.dumps(meta, indent=2) + "\n")
    done = {(r["method"], r["n"], r["seed"]) for r in rows}
    jobs = [(m, n, s, cfg) for n in range(cfg.n_min, cfg.n_max + 1) for m in cfg.methods for s in range(cfg.seeds)
            if (m, n, s) not in done and (n <= cfg.n_max_is or not m.endswith("-is"))]
    jobs.sort(key=lambda job: -job[1])  # the largest chains first, so two workers finish together
    if done:
        print(f"resuming: {len(done)} runs already in {runs_path}, {len(jobs)} to go")
    else:
        print(f"{len(jobs)} runs; each finished run is appended to {runs_path} (interrupted? add --resume)")
    new_file = not runs_path.exists()
    t0 = time.perf_counter()
    with open(runs_path, "a", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        if new_file:
            writer.writeheader()
        for row in _execute(jobs, args.workers):
            writer.writerow(row)
            f.flush()  # every finished run is on disk: an interrupted study resumes where it stopped
            rows.append(row)
    summary = write_outputs(rows, out, cfg, command)
    print(f"\n{len(jobs)} runs in {time.perf_counter() - t0:.0f} s\n")
    print_not_converged(rows)
    print_table(summary)
    print(f"\nwrote {out}/runs.csv, summary.csv, meta.json, cliffwalk.png")  # last: where the results are
    return 0


def print_not_converged(rows: list[dict]) -> None:
    """One line per method whose runs did not all converge (rather than one line per run through the
    progress bar): how many stalled or hit the cap, and at which n."""
    for method in METHODS:
        sel = [r for r in rows if r["method"] == method]
        bad = [r for r in sel if not r["converged"]]
        if not bad:
            continue
        ns = sorted({r["n"] for r in bad})
        stalled, capped = sum(r["stalled"] for r in bad), sum(r["hit_cap"] for r in bad)
        print(f"note: {method}: {len(bad)} of {len(sel)} runs did not converge ({stalled} stalled, {capped} hit "
              f"the cap) at n = {', '.join(map(str, ns))}")


def _execute(jobs, workers):
    return run_jobs(_run_job, jobs, workers, "cliffwalk runs")


def print_table(summary: list[dict]) -> None:
    print("| method | n | memory | median updates to convergence | min | max | converged / runs |")
    print("|---|---|---|---|---|---|---|")
    for s in summary:
        flag = "" if s["converged"] == s["runs"] else f" ({s['stalled']} stalled, {s['hit_cap']} capped)"
        cells = [f"{s[k]:,.0f}" if np.isfinite(s[k]) else "not reached" for k in
                 ("median_updates", "min_updates", "max_updates")]
        print(f"| {s['method']} | {s['n']} | {s['memory_size']:,} | {' | '.join(cells)} | "
              f"{s['converged']}/{s['runs']}{flag} |")


if __name__ == "__main__":
    sys.exit(main())
