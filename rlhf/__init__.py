"""rlhf: the whole RLHF pipeline of "Secrets of RLHF, Part I: PPO" (PPO-max) and APA."""

__version__ = "0.1.0"
