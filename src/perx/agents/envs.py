"""Environments for the agents: MinAtar, Atari (ale-py) and Gymnasium's classic control, by id.

* ``MinAtar/<Game>-v0`` (Breakout, SpaceInvaders, Asterix, Freeway, Seaquest): MinAtar's Gymnasium
  registration (``minatar.gym.register_envs()``, needed since Gymnasium 1.x dropped plugin loading),
  with its defaults: sticky actions p = 0.1 and difficulty ramping on, the full action set of 6
  (the ``-v0`` ids; what published MinAtar results use). Observations: bool [10, 10, channels]; no
  time limit of their own.
* ``ALE/<Game>-v5``: ale-py's ROMs, with 004 Appendix D.2's preprocessing: frame skip 4 (max-pooled),
  sticky actions 0.25, 84x84 grayscale, 4 stacked frames (uint8 [4, 84, 84]), up to 30 no-ops at reset.
  Needs ``ale-py`` and ``opencv-python-headless`` (``perx[atari]``). GPU-scale: smoke-tested only here.
* anything else: ``gymnasium.make(env_id)`` (``CartPole-v1`` for the quickest smoke test).
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

MINATAR_GAMES = ("Breakout", "SpaceInvaders", "Asterix", "Freeway", "Seaquest")


def check_env_id(env_id: str) -> None:
    """Raise ValueError naming ``env_id`` unless :func:`make_env` can build it (a registered Gymnasium id, with
    MinAtar's and ale-py's ids registered first); builds nothing."""
    import gymnasium as gym

    if env_id.startswith("MinAtar/"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import minatar.gym

            minatar.gym.register_envs()
    if env_id.startswith("ALE/"):
        try:
            import ale_py
        except ImportError:
            raise ValueError(f"env: {env_id!r} needs ale-py and opencv (pip install 'perx[atari]')") from None
        gym.register_envs(ale_py)
    try:
        gym.spec(env_id)
    except gym.error.Error as err:
        raise ValueError(f"env: unknown environment {env_id!r} ({err}); e.g. MinAtar/Breakout-v0 (MinAtar: "
                         f"{', '.join(MINATAR_GAMES)}), ALE/Pong-v5, CartPole-v1") from None


def make_env(env_id: str, *, max_episode_steps: int | None = None) -> Any:
    """A Gymnasium env for ``env_id`` (see the module docstring)."""
    import gymnasium as gym

    kwargs: dict[str, Any] = {}
    if env_id.startswith("MinAtar/"):
        with warnings.catch_warnings():  # minatar imports seaborn, which warns about its own dependencies
            warnings.simplefilter("ignore")
            import minatar.gym

            minatar.gym.register_envs()
    if env_id.startswith("ALE/"):
        import ale_py

        gym.register_envs(ale_py)
        env = gym.make(env_id, frameskip=1, repeat_action_probability=0.25)
        env = gym.wrappers.AtariPreprocessing(env, noop_max=30, frame_skip=4, screen_size=84, grayscale_obs=True,
                                              terminal_on_life_loss=False)
        env = gym.wrappers.FrameStackObservation(env, 4, padding_type="reset")
        # a cap in agent steps (the ALE's own limit, under the frame skip, counts emulator frames)
        return gym.wrappers.TimeLimit(env, max_episode_steps) if max_episode_steps is not None else env
    if max_episode_steps is not None:
        kwargs["max_episode_steps"] = max_episode_steps
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return gym.make(env_id, **kwargs)


def network_input(obs: np.ndarray, env_id: str) -> np.ndarray:
    """Observations [..., *obs_shape] as the network's float32 input: MinAtar channels first, Atari
    frames scaled to [0, 1], anything else as is."""
    if env_id.startswith("MinAtar/"):
        return np.moveaxis(obs, -1, -3).astype(np.float32)
    if env_id.startswith("ALE/"):
        return obs.astype(np.float32) / 255.0
    return obs.astype(np.float32)
