"""rlscale: RLVR (GRPO family) for language models and AlphaZero-style self-play."""

import os

__version__ = "0.1.0"

# transformers 5.2x, with the `kernels` package it depends on, swaps some layers (Qwen2's
# rotary embedding among them) for kernels downloaded from the Hugging Face Hub when a model
# runs on CUDA: code fetched at run time, and an error on a machine without the Hub ("could
# not verify publisher trust status"). rlscale runs the models it loads from local paths
# with torch's own ops; USE_HUB_KERNELS=YES in the environment turns the Hub's kernels back on.
os.environ.setdefault("USE_HUB_KERNELS", "NO")
