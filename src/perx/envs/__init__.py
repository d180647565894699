"""Small environments of perx's own (numpy only)."""

from perx.envs.cliffwalk import BlindCliffwalk

__all__ = ["BlindCliffwalk"]
