"""What every trainer shares: the learner (learner.py: a module, its optimizer, the data
parallelism applied to it, and the micro-batch engine's step), its parts of one concept each
(optimizer.py: AdamW, its schedule, clipping and the NaN guard; micro_batches.py: the rank share,
micro-batches, fillers and token weights; accumulation.py: the data-parallel passes of a step;
step_stats.py: a step's statistics), starting a run (setup.py), the LM loss (lm_loss.py), guards on scores (guards.py) and
prompts against the model's context (context_check.py). What serves the supervised stages only is in
supervised/: their skeleton (the package itself), its checkpoints (checkpoint.py) and the model call
every forward goes through (model_call.py)."""
