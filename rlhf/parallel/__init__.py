"""The data-parallel library every trainer shares (the RL runtimes and the supervised stages alike):
the ranks of a process group and their collectives (peers.py, process_group.py), DDP
(replicated.py), per-layer FSDP2 sharding as torchtitan's apply_fsdp (fsdp.py), what a strategy
shards (parallel_plan.py), a rollout's rows over the ranks (rollout_share.py) and the CPU threads
each process may use (threads.py). The runtimes (rlhf/runtime/) and the micro-batch engine
(rlhf/train/learner.py) build on it; nothing here knows roles or the RL loop.
"""
