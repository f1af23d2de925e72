"""The built-in world's demo (`rlhf demo`, run.py), the world's score distortion in the RL loop
(world_scores.py) and the ablations (`rlhf ablate`, ablate/)."""
