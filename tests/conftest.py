"""Shared factories: every sampler goes through the same conformance checks."""

import hashlib
import os
import shutil
import sys
from pathlib import Path


def _kernel_cache_for_these_sources() -> None:
    """Point numba's on-disk cache at a directory named by a hash of perx's sources (unless NUMBA_CACHE_DIR
    is set, or numba is already imported). Numba checks a cached kernel against its own file only, so after
    an edit of one module the kernels of another that call into it would keep the old code, and the tests
    would pass or fail on kernels that are not the ones in the checkout (docs/speed.md, "Measuring after an
    edit"). Directories of other hashes are removed."""
    if "NUMBA_CACHE_DIR" in os.environ or "numba" in sys.modules:
        return
    root = Path(__file__).resolve().parents[1]
    src = root / "src" / "perx"
    if not src.is_dir():
        return
    digest = hashlib.sha256()
    for path in sorted(src.rglob("*.py")):
        digest.update(path.relative_to(src).as_posix().encode())
        digest.update(path.read_bytes())
    caches = root / ".numba_cache"
    here = caches / digest.hexdigest()[:16]
    if caches.is_dir():
        for old in caches.iterdir():
            if old != here:
                shutil.rmtree(old, ignore_errors=True)
    os.environ["NUMBA_CACHE_DIR"] = str(here)


_kernel_cache_for_these_sources()
# perx._jit: every call of a kernel bound to a signature checks its arguments' types against it
os.environ.setdefault("PERX_CHECK_ENTRIES", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

import perx  # noqa: E402

#: name -> factory of a fresh, unbound sampler. Later samplers join this list.
SAMPLERS = {
    "uniform": lambda: perx.Uniform(),
    "proportional": lambda: perx.Proportional(alpha=0.6),
    "proportional-independent": lambda: perx.Proportional(alpha=0.6, stratified=False),
    "proportional-batchnorm": lambda: perx.Proportional(alpha=0.7, normalize="batch"),
    # 000 Sec. 3.4's literal normalisation by the buffer-wide largest weight (the default is the batch's)
    "proportional-buffernorm": lambda: perx.Proportional(alpha=0.7, normalize="buffer"),
    "rank-buffernorm": lambda: perx.RankBased(alpha=0.7, normalize="buffer"),
    "proportional-buffermax": lambda: perx.Proportional(alpha=0.5, max_priority="buffer"),
    "rank": lambda: perx.RankBased(alpha=0.7),
    "rank-sort-often": lambda: perx.RankBased(alpha=0.5, sort_every=7),
    "rank-exact": lambda: perx.RankBased(alpha=0.7, exact=True),
    "rank-fixed-segments": lambda: perx.RankBased(alpha=0.7, segments=8),
    "greedy": lambda: perx.Greedy(),
    "lap": lambda: perx.LAP(alpha=0.4, kappa=1.0),
    "lap-small-kappa": lambda: perx.LAP(alpha=0.6, kappa=0.01),
    "hybrid": lambda: perx.Hybrid([perx.Proportional(alpha=0.6), perx.Uniform()], [0.75, 0.25]),
    "hybrid-rank-lap": lambda: perx.Hybrid([perx.RankBased(alpha=0.7), perx.LAP(alpha=0.4)], [0.5, 0.5]),
    "hybrid-random": lambda: perx.Hybrid([perx.RankBased(alpha=0.7, segments=8), perx.Uniform()], [0.4, 0.6],
                                         mixing="random"),
}

#: Samplers whose draw is deterministic (no probability distribution over the buffer).
DETERMINISTIC = (perx.Greedy,)


@pytest.fixture(params=sorted(SAMPLERS))
def make_sampler(request):
    return SAMPLERS[request.param]


def transitions(n, start=0, obs_dim=3):
    """n distinct transitions; obs[:, 0] holds the insertion number so rows can be identified."""
    k = np.arange(start, start + n)
    obs = np.zeros((n, obs_dim), np.float32)
    obs[:, 0] = k
    return {
        "obs": obs,
        "action": (k % 4).astype(np.int64),
        "reward": (k * 0.5).astype(np.float32),
        "next_obs": obs + 1,
        "terminated": k % 7 == 0,
        "truncated": k % 11 == 0,
    }


def filled(sampler, capacity=50, n=None, seed=0):
    buf = perx.ReplayBuffer(capacity, sampler, seed=seed)
    buf.extend(**transitions(capacity if n is None else n))
    return buf


def snapshot(buf):
    """Everything observable about a buffer's state, for 'nothing changed' checks."""
    meta, arrays = buf.sampler.state_dict()
    return {
        "next": buf.next_index,
        "len": len(buf),
        "data": {k: v.copy() for k, v in buf._storage.data.items()},
        "sampler_arrays": {k: v.copy() for k, v in arrays.items()},
        "sampler_meta": repr(meta),
    }


def assert_same(a, b):
    assert a["next"] == b["next"] and a["len"] == b["len"]
    assert a["sampler_meta"] == b["sampler_meta"]
    for k in a["data"]:
        np.testing.assert_array_equal(a["data"][k], b["data"][k])
    for k in a["sampler_arrays"]:
        np.testing.assert_array_equal(a["sampler_arrays"][k], b["sampler_arrays"][k])
