"""Run independent jobs of a study on worker processes (spawn), with a progress bar when tqdm is there."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any


def run_jobs(fn: Callable[[Any], Any], jobs: Sequence[Any], workers: int, desc: str) -> Iterator[Any]:
    """Yield ``fn(job)`` for every job as it finishes (unordered with several workers). ``fn`` must be a
    module-level function so that spawned workers can import it."""
    try:
        from tqdm import tqdm
    except ImportError:  # no progress bar without tqdm (the experiments extra installs it)
        def tqdm(iterable, **kwargs):
            return iterable
    if workers <= 1 or len(jobs) <= 1:
        yield from tqdm(map(fn, jobs), total=len(jobs), desc=desc, unit="run")
        return
    import multiprocessing as mp

    with mp.get_context("spawn").Pool(workers) as pool:
        yield from tqdm(pool.imap_unordered(fn, jobs), total=len(jobs), desc=desc, unit="run")
