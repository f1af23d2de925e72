"""rlhf: the whole RLHF pipeline: SFT, reward model, and in one loop PPO and PPO-max ("Secrets of RLHF,
Part I: PPO"), APA and AWR, GRPO, Dr. GRPO, RLOO and REINFORCE++; evaluation."""

__version__ = "0.1.0"
