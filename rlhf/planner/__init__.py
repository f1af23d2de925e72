"""`rlhf plan`: the per-rank peak memory of each role and phase predicted from a model's shape, a
preset and a parallel strategy, before anything loads (memory_plan.py; the job the command's flags
and a preset's roles make: job.py; docs/memory.md)."""
