"""The RL loop (trainer.py) and what it is made of: the roles (roles/), the experience of a rollout
(experience.py), response groups (groups.py), the prompt stream (prompts.py), Python reward
functions (reward_functions.py), rollout metrics (metrics.py) and the samples' log (sample_log.py)."""
