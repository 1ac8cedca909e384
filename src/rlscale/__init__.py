"""rlscale: RLVR (GRPO family) for language models and AlphaZero-style self-play."""

__version__ = "0.1.0"
