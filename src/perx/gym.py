"""Feeding Gymnasium vector environments into a perx buffer, correctly in every autoreset mode.

``VectorRecorder(buffer, envs)`` wraps ``envs.reset`` and ``envs.step`` and writes one transition per
sub-environment step into the buffer, as stream ``i`` for sub-environment ``i`` (so a buffer with
``perx.Episodes(streams=envs.num_envs, ...)`` keeps each sub-environment's episodes apart). What it
handles, per Gymnasium's autoreset mode (``envs.metadata["autoreset_mode"]``):

* next-step (Gymnasium 1.x's default): the step after an episode ends only resets that sub-environment
  (its action is ignored, its reward is 0, its observation is the reset one). That step is *not* a
  transition and is not stored; without this, a bogus final -> reset transition crosses the episode
  boundary.
* same-step: the step that ends an episode returns the reset observation and puts the final one in
  ``info["final_obs"]``; the stored transition gets the final observation as ``next_obs``.
* disabled: the caller resets finished sub-environments with ``recorder.reset(options={"reset_mask":
  mask})``, which the recorder follows.

``terminated`` and ``truncated`` are stored apart. Gymnasium is not imported: anything with Gymnasium's
vector API works (``num_envs``, ``reset``, ``step``, ``metadata``). Observations are arrays [num_envs, ...] or,
for a ``Dict`` observation space, dicts of such arrays (one per key; stored as a dict field of the buffer, and
``info["final_obs"][i]`` of same-step autoreset is then sub-env i's dict). Nested dicts are not supported.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

NEXT_STEP, SAME_STEP, DISABLED = "NextStep", "SameStep", "Disabled"


def autoreset_mode(envs: Any) -> str:
    """The autoreset mode of a Gymnasium vector env as a string ("NextStep", "SameStep", "Disabled")."""
    mode = getattr(envs, "metadata", {}).get("autoreset_mode", NEXT_STEP)
    value = getattr(mode, "value", mode)
    if value not in (NEXT_STEP, SAME_STEP, DISABLED):
        raise ValueError(f"envs: unknown autoreset mode {mode!r}")
    return value


class VectorRecorder:
    """Steps a vector env and stores every real transition in ``buffer`` (see the module docstring).

    Args:
        buffer: a ``perx.ReplayBuffer``. With ``perx.Episodes`` it needs ``streams >= envs.num_envs``.
            Or a list of ``envs.num_envs`` buffers: sub-env i then writes to buffer i (as its stream 0),
            e.g. one buffer per independent run trained in lockstep.
        envs: a Gymnasium vector env.
        obs: field name of the observation (``next_`` + it for the next one); default the buffer's
            episode configuration's, else ``"obs"``.

    Use ``obs, info = recorder.reset(seed=...)`` and ``recorder.step(actions)`` in place of the env's own
    calls; they return what the env returns. ``recorder.transitions`` counts what was stored and
    ``recorder.skipped`` the reset-only steps dropped.
    """

    def __init__(self, buffer: Any, envs: Any, *, obs: str | None = None) -> None:
        self.buffer = buffer
        self.envs = envs
        self.num_envs = int(envs.num_envs)
        self.mode = autoreset_mode(envs)
        self._split = isinstance(buffer, list | tuple)
        if self._split and len(buffer) != self.num_envs:
            raise ValueError(f"buffer: a list of {len(buffer)} buffers for {self.num_envs} sub-environments")
        first = buffer[0] if self._split else buffer
        episodes = getattr(first, "episodes", None)
        if not self._split and episodes is not None and episodes.streams < self.num_envs:
            raise ValueError(f"buffer: its perx.Episodes has {episodes.streams} streams but the env has "
                             f"{self.num_envs} sub-environments")
        self._streams = episodes is not None
        self.obs_name = obs or (episodes.obs if episodes is not None else "obs")
        self.next_name = "next_" + self.obs_name
        self.obs: np.ndarray | dict[str, np.ndarray] | None = None
        self._autoreset = np.zeros(self.num_envs, np.bool_)
        self.transitions = 0
        self.skipped = 0

    def reset(self, **kwargs: Any) -> tuple[Any, dict]:
        """``envs.reset(**kwargs)``; with ``options={"reset_mask": mask}`` only those sub-envs restart.

        An episode that a reset cuts short ends in the buffer at its last stored step, as a truncation
        (``buffer.end_episodes``), so no n-step window runs across the reset."""
        mask = (kwargs.get("options") or {}).get("reset_mask")  # read first: Gymnasium pops it
        mask = np.ones(self.num_envs, np.bool_) if mask is None or self.obs is None else np.array(mask, np.bool_)
        obs, info = self.envs.reset(**kwargs)
        obs = _as_obs(obs)
        if self._streams and self._split:
            for i in np.flatnonzero(mask):
                self.buffer[i].end_episodes()
        elif self._streams:
            self.buffer.end_episodes(np.flatnonzero(mask))
        if self.obs is None:
            self.obs = _copy(obs)
        elif isinstance(obs, dict):
            for key, value in obs.items():
                self.obs[key][mask] = value[mask]
        else:
            self.obs[mask] = obs[mask]
        self._autoreset[mask] = False
        return obs, info

    def step(self, actions: Any) -> tuple[Any, Any, Any, Any, dict]:
        """``envs.step(actions)``, storing the transitions it completes."""
        if self.obs is None:
            raise RuntimeError("VectorRecorder.step: call reset() first")
        result = self.envs.step(actions)
        self.record(actions, *result)
        return result

    def record(self, actions: Any, next_obs: Any, rewards: Any, terminated: Any, truncated: Any,
               infos: dict) -> np.ndarray:
        """Store the transitions of one vector step that the caller made itself; returns their ids."""
        next_obs = _as_obs(next_obs)
        terminated = np.asarray(terminated, np.bool_)
        truncated = np.asarray(truncated, np.bool_)
        actions = np.asarray(actions)
        rewards = np.asarray(rewards)
        n = self.num_envs
        if self.mode == NEXT_STEP:
            valid = ~self._autoreset  # a sub-env that ended last step only reset now: no transition
        else:
            valid = np.ones(n, np.bool_)
        real_next = next_obs
        ended = terminated | truncated
        if self.mode == SAME_STEP and ended.any():
            real_next = _copy(next_obs)
            final = infos.get("final_obs")
            if final is None:
                raise ValueError("infos: same-step autoreset needs info['final_obs'] for the sub-envs that ended")
            for i in np.flatnonzero(ended):
                if isinstance(real_next, dict):  # a Dict space: final_obs[i] is sub-env i's dict
                    for key, value in real_next.items():
                        value[i] = np.asarray(final[i][key])
                else:
                    real_next[i] = np.asarray(final[i])
        ids = np.empty(0, np.int64)
        if valid.any():
            rows = np.flatnonzero(valid)
            fields = {self.obs_name: _take(self.obs, rows), "action": actions[rows], "reward": rewards[rows],
                      self.next_name: _take(real_next, rows), "terminated": terminated[rows],
                      "truncated": truncated[rows]}
            if self._split:  # sub-env i -> buffer i; the ids returned are each buffer's own
                ids = np.concatenate([self.buffer[i].extend(**{k: _take(v, slice(t, t + 1)) for k, v in fields.items()})
                                      for t, i in enumerate(rows.tolist())])
            elif self._streams:
                ids = self.buffer.extend(stream=rows, **fields)
            else:
                ids = self.buffer.extend(**fields)
            self.transitions += len(rows)
        self.skipped += int((~valid).sum())
        self.obs = _copy(next_obs)
        if self.mode == NEXT_STEP:
            self._autoreset = ended & valid
        return ids


def _as_obs(obs: Any) -> np.ndarray | dict[str, np.ndarray]:
    """A vector env's observations: an array [num_envs, ...], or (a Dict space) a dict of such arrays."""
    if isinstance(obs, Mapping):
        out = {}
        for key, value in obs.items():
            if isinstance(value, Mapping):
                raise TypeError(f"obs: nested Dict observations are not supported (key {key!r} holds a dict); "
                                f"flatten the inner dicts with a wrapper first")
            out[key] = np.asarray(value)
        return out
    return np.asarray(obs)


def _copy(obs: np.ndarray | dict) -> np.ndarray | dict:
    return {k: v.copy() for k, v in obs.items()} if isinstance(obs, dict) else obs.copy()


def _take(value: np.ndarray | dict, rows: Any) -> np.ndarray | dict:
    return {k: v[rows] for k, v in value.items()} if isinstance(value, dict) else value[rows]
