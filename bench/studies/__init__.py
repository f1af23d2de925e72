"""Studies: algorithm comparisons and ablations on the built-in world and real models."""
