"""Another algorithm as an arm of the ablation (`rlhf ablate --add-arm PRESET`, e.g. online_dpo): a
run of that preset beside the variants, on the same world, SFT model, reward model and seeds, its
numbers paired by seed with the full preset's as every variant's are.

An algorithm is no switch of the ablated preset (online DPO has no critic, and its own advantage,
groups and loss), so an arm trains its own preset at the ablation's scale: the ablation's settings,
less those only a critic reads when the arm has none and less the responses per prompt (the arm's
own), with as many responses per iteration as the ablated preset samples (as `rlhf demo --compare`).
"""

from __future__ import annotations

import copy

from rlhf.config import PRESETS, ConfigError, RLConfig, deep_merge, load_config
from rlhf.demo.ablate.tricks import Variant
from rlhf.demo.run import without_critic

# where each preset's algorithm is defined (the preset file's header and docs/algorithms.md say more)
ARM_SOURCES = {
    "vanilla_ppo": "PPO paper §5.2",
    "ppo_max": "PPO paper §5.4",
    "apa": "APA paper eq. 9",
    "awr": "APA paper eq. 6",
    "grpo": "DeepSeekMath paper §4.1-4.2",
    "rloo": "Ahmadian et al. 2024 §3.2",
    "reinforce_pp": "Hu 2025 §3 (REINFORCE++)",
    "dapo": "Yu et al. 2025 §3 (DAPO)",
    "gspo": "Zheng et al. 2025 §4 (GSPO)",
    "cispo": "MiniMax-M1 2025 §3.1 (CISPO)",
    "online_dpo": "Guo et al. 2024 §3 (online DPO, docs/algorithms.md §45)",
}


def arm_settings(preset: str, settings: dict, arm: str) -> dict:
    """The RL settings of an `arm` run in an ablation of `preset` with `settings` (the module's rule)."""
    ablated = load_config(RLConfig, preset=preset, overrides=settings)
    responses = ablated.rollout.batch_size * ablated.rollout.samples_per_prompt
    own = load_config(RLConfig, preset=arm)
    layers = copy.deepcopy(settings)
    if not own.uses_critic:
        layers = without_critic(layers)
    rollout = layers.setdefault("rollout", {})
    rollout.pop("samples_per_prompt", None)
    rollout["batch_size"] = max(1, responses // own.rollout.samples_per_prompt)
    return layers


def arm_variants(preset: str, settings: dict, arms: tuple[str, ...]) -> list[Variant]:
    """One variant per arm, its settings checked now (ConfigError naming the arm, exit 2)."""
    out = []
    for arm in dict.fromkeys(arms):  # each once
        if arm not in PRESETS:
            raise ConfigError(f"--add-arm {arm!r} is not a preset. Fix: one of {', '.join(PRESETS)}.")
        if arm == preset:
            raise ConfigError(
                f"--add-arm {arm} is the ablated preset itself (the row `full`). Fix: name another preset, "
                "e.g. --add-arm online_dpo."
            )
        try:
            load_config(RLConfig, preset=arm, overrides=arm_settings(preset, settings, arm))
        except ConfigError as err:
            raise ConfigError(f"--add-arm {arm}: {err}", err.key) from None
        out.append(Variant(f"arm_{arm}", {}, None, ARM_SOURCES[arm], preset=arm))
    return out


def run_layers(preset: str, settings: dict, variant: Variant) -> tuple[str, dict]:
    """(the preset a variant's run trains, its RL settings): an arm's own, else the variant's switch
    over the ablation's settings."""
    if variant.preset:
        return variant.preset, arm_settings(preset, settings, variant.preset)
    return preset, deep_merge(settings, variant.overrides)
