"""The tricks of PPO paper §5.3 and §5.4 as config switches, and the variants of an ablation.

A variant differs from the full preset in the fields of exactly one trick: a trick the preset
uses is switched off; one it leaves off (PPO-max's advantage whitening, say) is switched on.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rlhf.config import RLConfig, deep_merge, load_config, to_dict


@dataclass(frozen=True)
class Trick:
    name: str
    source: str  # where the PPO paper studies it
    off: dict  # nested RLConfig overrides that switch the trick off
    on: dict | None  # ... that switch it on, for a preset that leaves it off (None: never added)
    needs_ptx_data: bool = False  # only meaningful with data.ptx (absent on the built-in world)
    optional: bool = False  # not a PPO paper trick: a variant only when named (`rlhf ablate --add-trick`)
    losses: tuple[str, ...] = ()  # the policy losses it acts on (empty: any)

    def fields(self) -> set[str]:
        return set(_leaves(self.off))


TRICKS: tuple[Trick, ...] = (
    Trick(
        "reward_normalization",
        "PPO paper §5.3.1",
        {"reward": {"normalize": False}},
        {"reward": {"normalize": True}},
    ),
    Trick("reward_clipping", "PPO paper §5.3.1", {"reward": {"clip": None}}, {"reward": {"clip": 10.0}}),
    Trick("kl_penalty", "PPO paper §5.3.2", {"kl": {"beta": 0.0}}, {"kl": {"beta": 0.05}}),
    Trick(
        "critic_from_reward_model",
        "PPO paper §5.3.3",
        {"model": {"critic_init": "policy"}},
        {"model": {"critic_init": "reward_model"}},
    ),
    Trick(
        "critic_pretraining",
        "PPO paper §5.3.3",
        {"critic": {"pretrain_iterations": 0}},
        {"critic": {"pretrain_iterations": 10}},
    ),
    Trick(
        "gradient_clipping",
        "PPO paper §5.4, appendix C.2",
        {"policy_optim": {"max_grad_norm": None}, "critic_optim": {"max_grad_norm": None}},
        {"policy_optim": {"max_grad_norm": 1.0}, "critic_optim": {"max_grad_norm": 1.0}},
    ),
    Trick(
        "value_clipping", "PPO paper §5.4", {"critic": {"value_clip": None}}, {"critic": {"value_clip": 0.2}}
    ),
    Trick(
        "advantage_whitening",
        "PPO paper §5.3.1",
        {"advantage": {"whiten": False}},
        {"advantage": {"whiten": True}},
    ),
    # off: a buffer of 4 rollout batches reused each iteration instead of the newest one only
    Trick(
        "small_buffer", "PPO paper §5.3.2, §5.4", {"train": {"buffer_size": 4}}, {"train": {"buffer_size": 1}}
    ),
    Trick("ptx", "PPO paper §5.4", {"policy": {"ptx_coef": 0.0}}, None, needs_ptx_data=True),
    # the switches of later papers, ablated when named (docs/algorithms.md §43-44)
    Trick("clip_cov", "Cui et al. 2025 §4.3", {"policy": {"cov_control": "none"}},
          {"policy": {"cov_control": "clip_cov"}}, optional=True, losses=("ppo",)),
    Trick("kl_cov", "Cui et al. 2025 §4.3", {"policy": {"cov_control": "none"}},
          {"policy": {"cov_control": "kl_cov"}}, optional=True, losses=("ppo",)),
    Trick("rollout_correction", "Yao et al. 2025 (truncated IS)", {"rollout": {"correction": {"enabled": False}}},
          {"rollout": {"correction": {"enabled": True}}}, optional=True),
)  # fmt: skip
OPTIONAL_TRICKS = tuple(t.name for t in TRICKS if t.optional)


@dataclass(frozen=True)
class Variant:
    name: str  # "full", "no_<trick>" or "with_<trick>"
    overrides: dict = field(default_factory=dict)  # over the full preset's settings
    trick: str | None = None
    source: str = ""


def _leaves(tree: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in tree.items():
        out.update(_leaves(value, f"{prefix}{key}.") if isinstance(value, dict) else {prefix + key: value})
    return out


def variants(
    preset: str, settings: dict, *, has_ptx_data: bool = False, extra: tuple[str, ...] = ()
) -> tuple[list[Variant], list[dict]]:
    """(the full preset and one variant per trick, the tricks skipped with the reason), for `preset`
    resolved with `settings` (nested RLConfig overrides, e.g. the ablation's model-scale rates);
    `extra`: the optional tricks to ablate too (OPTIONAL_TRICKS)."""
    config = load_config(RLConfig, preset=preset, overrides=settings)
    full = _leaves(to_dict(config))
    out, skipped = [Variant("full")], []
    for trick in TRICKS:
        if trick.optional and trick.name not in extra:
            continue  # named with --add-trick only
        if trick.losses and config.policy.loss not in trick.losses:
            skipped.append({"trick": trick.name, "reason": f"acts on the {'/'.join(trick.losses)} loss only"})
            continue
        if trick.needs_ptx_data and not has_ptx_data:
            skipped.append({"trick": trick.name, "reason": "no ptx data (data.ptx) on the built-in world"})
            continue
        is_on = any(full[key] != value for key, value in _leaves(trick.off).items())
        if is_on:
            out.append(Variant(f"no_{trick.name}", trick.off, trick.name, trick.source))
        elif trick.on is not None:
            out.append(Variant(f"with_{trick.name}", trick.on, trick.name, trick.source))
        else:
            skipped.append({"trick": trick.name, "reason": f"{preset} does not use it"})
    return out, skipped


def resolved(preset: str, settings: dict, variant: Variant) -> RLConfig:
    return load_config(RLConfig, preset=preset, overrides=deep_merge(settings, variant.overrides))
