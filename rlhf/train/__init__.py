"""What every trainer shares: the learner and its micro-batch engine (learner.py: the rank share,
micro-batches, fillers, token weights, the data-parallel passes, the optimizer step, and AdamW with
its schedule), starting a run (setup.py), the LM loss (lm_loss.py), guards on scores
(guards.py), prompts against the model's context (context_check.py), and the supervised stages'
skeleton (supervised.py, with its model call model_call.py and checkpoints supervised_checkpoint.py)."""
