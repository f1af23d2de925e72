"""The four roles of RLHF as separate objects (OpenRLHF style): policy, reference, critic, reward model.

Each role has a narrow interface over the rollout layout, so that placing roles on Ray actors
changes the wiring and not the math.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlhf.config import RLConfig
from rlhf.models.loading import load_causal_lm, load_tokenizer, prepare_tokenizer
from rlhf.models.reference import ReferenceModel
from rlhf.models.scalar_head import ScalarHeadModel, init_critic
from rlhf.train.setup import with_lora


@dataclass
class Roles:
    tokenizer: object
    policy: torch.nn.Module  # causal LM (a PEFT model when LoRA is on)
    reference: ReferenceModel  # frozen copy, or the policy with its adapter disabled
    critic: ScalarHeadModel  # value at every position
    reward_model: ScalarHeadModel  # scalar at the last real token


def assemble_roles(
    config: RLConfig,
    *,
    tokenizer,
    policy: torch.nn.Module,
    reward_model: ScalarHeadModel,
) -> Roles:
    """Build reference and critic around an SFT policy and a reward model (both already loaded)."""
    tokenizer = prepare_tokenizer(tokenizer)
    reward_model.eval().requires_grad_(False)
    torch.manual_seed(config.seed)
    if config.model.critic_mode == "separate":
        if config.model.critic_init == "reward_model":
            critic = init_critic(reward_model)  # a copy of the reward model (PPO paper sec. 5.3.4)
        else:
            critic = init_critic(policy)  # a copy of the SFT trunk with a zero head
    if config.model.lora.enabled:
        policy = with_lora(policy, config.model.lora)
        reference = ReferenceModel(policy, mode="adapter")  # no second copy of the weights
    else:
        reference = ReferenceModel(policy, mode="copy")
    if config.model.critic_mode == "shared":
        critic = ScalarHeadModel.from_causal_lm(policy, head_init_std=0.0)  # value head on the policy trunk
    elif config.model.critic_lora.enabled:
        critic = with_lora(critic, config.model.critic_lora)  # adapters + the value head train
    else:
        critic.requires_grad_(True)
    policy.eval()  # no dropout: the first PPO ratio is exactly 1
    critic.eval()
    return Roles(
        tokenizer=tokenizer, policy=policy, reference=reference, critic=critic, reward_model=reward_model
    )


def load_roles(config: RLConfig) -> Roles:
    """Load policy, reward model and tokenizer from the paths in `config.model`."""
    if not config.model.policy:
        raise ValueError("model.policy is empty. Fix: --policy DIR (the SFT run directory).")
    if not config.model.reward_model:
        raise ValueError(
            "model.reward_model is empty. Fix: --reward-model DIR (the reward-model run directory)."
        )
    tokenizer = load_tokenizer(config.model.policy, gguf_file=config.model.gguf_file)
    policy = load_causal_lm(config.model.policy, gguf_file=config.model.gguf_file)
    reward_model = ScalarHeadModel.from_pretrained(config.model.reward_model)
    return assemble_roles(config, tokenizer=tokenizer, policy=policy, reward_model=reward_model)
