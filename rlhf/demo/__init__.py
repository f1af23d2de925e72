"""The built-in world's demo (`rlhf demo`, run.py), its HTML report (report.py), its held-out
evaluation of a policy through any runtime (held_out.py), the world's score distortion in the RL
loop (world_scores.py) and the ablations (`rlhf ablate`, ablate/)."""
