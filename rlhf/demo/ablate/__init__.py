"""`rlhf ablate`: a preset with each of its tricks switched alone, over seeds, on the built-in world.

tricks.py   the PPO paper's tricks (and later papers' switches) as config switches, the variants of a preset
arms.py     other presets run beside the variants (`--add-arm online_dpo`)
stats.py    gold gain at a KL budget, t intervals over seeds, paired differences
runner.py   the world, SFT and reward model once (the demo's), the runs (parallel, resumable)
report.py   ablation.json's table and the report's forest plot
"""

from rlhf.demo.ablate.runner import run_ablation
from rlhf.demo.ablate.tricks import TRICKS, Trick, Variant, variants

__all__ = ["TRICKS", "Trick", "Variant", "run_ablation", "variants"]
