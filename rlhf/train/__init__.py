"""What every trainer shares: starting a run (setup.py), the optimizer and its schedule (optim.py),
the LM loss (lm_loss.py), guards on scores (guards.py) and prompts against the model's context
(context_check.py)."""
