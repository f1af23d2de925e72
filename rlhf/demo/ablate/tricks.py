"""The tricks of PPO paper §5.3 and §5.4 as config switches, and the variants of an ablation.

A variant differs from the full preset in the fields of exactly one trick: a trick the preset
uses is switched off; one it leaves off (PPO-max's advantage whitening, say) is switched on.
The switches of later papers (a loss in place of PPO's, Clip-Cov, rollout correction) are variants
only when named (`rlhf ablate --add-trick`); one that cannot act on the preset is skipped with
the reason, never run as a no-op.
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
    # acts on the sampler/trainer log-prob gap: a no-op where both compute in float32 (skipped there)
    needs_mismatch: bool = False

    def fields(self) -> set[str]:
        """The config keys the trick sets (a loss switch also sets that loss's clip range)."""
        return set(_leaves(self.off)) | set(_leaves(self.on or {}))


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
    # the switches of later papers, ablated when named (docs/algorithms.md §41-44)
    # a sequence-level ratio in place of PPO's token ratios, at the paper's clip range (GSPO §5.1)
    Trick("gspo", "Zheng et al. 2025 §4.1 (GSPO, eq. 5-7)", {"policy": {"loss": "ppo"}},
          {"policy": {"loss": "gspo", "clip_eps": 3e-4, "clip_eps_high": 4e-4}}, optional=True, losses=("ppo",)),
    # REINFORCE on every token with a clipped, gradient-free IS weight (the cispo preset's cap of 5)
    Trick("cispo", "MiniMax-M1 2025 §3.1 (CISPO, eq. 4-5)", {"policy": {"loss": "ppo"}},
          {"policy": {"loss": "cispo", "clip_eps_high": 4.0}}, optional=True, losses=("ppo",)),
    Trick("clip_cov", "Cui et al. 2025 §4.3", {"policy": {"cov_control": "none"}},
          {"policy": {"cov_control": "clip_cov"}}, optional=True, losses=("ppo",)),
    Trick("kl_cov", "Cui et al. 2025 §4.3", {"policy": {"cov_control": "none"}},
          {"policy": {"cov_control": "kl_cov"}}, optional=True, losses=("ppo",)),
    Trick("rollout_correction", "Yao et al. 2025 (truncated IS)", {"rollout": {"correction": {"enabled": False}}},
          {"rollout": {"correction": {"enabled": True}}}, optional=True, needs_mismatch=True),
)  # fmt: skip
OPTIONAL_TRICKS = tuple(t.name for t in TRICKS if t.optional)


@dataclass(frozen=True)
class Variant:
    name: str  # "full", "no_<trick>", "with_<trick>" or "arm_<preset>"
    overrides: dict = field(default_factory=dict)  # over the full preset's settings
    trick: str | None = None
    source: str = ""
    preset: str = ""  # an arm's own preset (arms.py); "": the ablated one


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
            reason = (
                f"acts on the {'/'.join(trick.losses)} loss only, and {preset} trains {config.policy.loss}"
            )
            skipped.append({"trick": trick.name, "reason": reason})
            continue
        if trick.needs_mismatch and computes_in_float32(config):
            skipped.append({"trick": trick.name, "reason": NO_MISMATCH})
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


NO_MISMATCH = (
    "the sampler and the trainer compute in float32 here: their log-probs of a token agree to float "
    "rounding (docs/monitors.md#sampler-trainer-mismatch), every weight is 1 and the switch a no-op. "
    "Fix: --rl.dtype bfloat16 (a sampler/trainer gap to correct)"
)


def computes_in_float32(config: RLConfig) -> bool:
    """Whether the run's precision resolves to float32 on its device (rlhf/models/precision.py)."""
    from rlhf.models.device import resolve_device
    from rlhf.models.precision import Precision

    device = resolve_device(config.train.device, key="rl.train.device")
    return Precision.resolve(config.dtype, device, key="rl.dtype").name == "float32"


def resolved(preset: str, settings: dict, variant: Variant) -> RLConfig:
    return load_config(RLConfig, preset=preset, overrides=deep_merge(settings, variant.overrides))
