"""The four roles of RLHF (OpenRLHF's model groups, verl's workers): `Policy` (generate,
log-probs, train_step), `Critic` (values, train_step), `Reference` (log-probs) and `RewardModel`
(score). Each owns its module, optimizer and schedule, micro-batching, gradient clipping and
checkpoint state; the RL loop talks to these interfaces, never to modules, and a runtime
(rlhf/runtime/) places them and schedules their work. `assemble.py` builds them from a config.
"""
