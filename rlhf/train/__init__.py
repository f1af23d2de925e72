"""What every trainer shares: the learner and its micro-batch engine (learner.py: the rank share,
micro-batches, fillers, token weights, the data-parallel passes, the optimizer step, and AdamW with
its schedule), starting a run (setup.py), the LM loss (lm_loss.py), guards on scores (guards.py) and
prompts against the model's context (context_check.py). What serves the supervised stages only is in
supervised/: their skeleton (the package itself), its checkpoints (checkpoint.py) and the model call
every forward goes through (model_call.py)."""
