"""The RL loop (trainer.py) and what it is given: a rollout source (rollout_source.py; sources.py
picks it: async_rollouts.py, episode_rollouts.py, agent_rollouts.py, dapo.py's dynamic sampling),
the scorer (scorer.py, reading episode_record.py), the guards (run_guards.py) and the monitors
(monitors.py); and what it is made of: the roles (roles/), the experience of a rollout
(experience.py), response groups (groups.py), the prompt stream (prompts.py), Python reward functions
(reward_functions.py), metrics (metrics.py) and the samples' log (sample_log.py)."""
