from .sampler import Rollout, SamplingParams, generate

__all__ = ["Rollout", "SamplingParams", "generate"]
