"""bench/speed/flops.py against torch's own FLOP counter on real tiny Llama models.

Eager attention is used because FlopCounterMode counts its two bmm's (QK^T, AV) but not the CPU
SDPA kernel; the matmul work is the same either way.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import AutoModelForCausalLM

from bench.speed.flops import (
    IterationShape,
    ModelShape,
    decoder_forward,
    generation,
    head_forward,
    iteration_phases,
)
from rlhf.models.sampling import SamplingConfig, generate
from rlhf.models.tiny import tiny_llama_config, word_tokenizer

WORDS = "alpha beta gamma delta eps zeta eta theta iota kappa lam mu nu xi omicron pi rho sigma tau".split()


@pytest.fixture(scope="module")
def tokenizer():
    return word_tokenizer([" ".join(WORDS)])


def eager_lm(tokenizer, kv_heads: int | None = None, seed: int = 0):
    config = tiny_llama_config(
        len(tokenizer), hidden_size=32, num_layers=2, num_heads=4, intermediate_size=48
    )
    if kv_heads is not None:
        config.num_key_value_heads = kv_heads
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config).eval()


def counted(fn) -> int:
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


@pytest.mark.parametrize("kv_heads", [4, 2])
def test_decoder_matmul_params_are_the_decoder_linear_weights(tokenizer, kv_heads):
    model = eager_lm(tokenizer, kv_heads)
    linear = sum(m.weight.numel() for m in model.model.modules() if isinstance(m, torch.nn.Linear))
    shape = ModelShape.from_config(model.config)
    assert shape.decoder_matmul_params == linear
    assert shape.head_params == model.lm_head.weight.numel()


@pytest.mark.parametrize(("rows", "seq", "kv_heads"), [(1, 1, 4), (1, 9, 4), (3, 7, 2), (4, 16, 4)])
def test_decoder_forward_matches_torch_flop_counter(tokenizer, rows, seq, kv_heads):
    model = eager_lm(tokenizer, kv_heads)
    ids = torch.randint(0, len(tokenizer), (rows, seq))
    with torch.no_grad():
        expected = counted(lambda: model.model(input_ids=ids))
    assert decoder_forward(ModelShape.from_config(model.config), rows, seq) == expected


def test_head_forward_matches_torch_flop_counter(tokenizer):
    model = eager_lm(tokenizer)
    hidden = torch.randn(5, 32)
    with torch.no_grad():
        expected = counted(lambda: model.lm_head(hidden))
    assert head_forward(ModelShape.from_config(model.config), 5) == expected


@pytest.mark.parametrize(("rows", "new_tokens"), [(1, 1), (1, 6), (3, 5)])
def test_generation_matches_our_sampler(tokenizer, rows, new_tokens):
    model = eager_lm(tokenizer)
    prompt = torch.randint(4, len(tokenizer), (rows, 6))
    mask = torch.ones_like(prompt)
    mask[0, :2] = 0  # left padding is computed all the same
    config = SamplingConfig(max_new_tokens=new_tokens, stop_at_eos=False)
    expected = counted(
        lambda: generate(model, prompt, mask, config, tokenizer.eos_token_id, tokenizer.pad_token_id)
    )
    assert generation(ModelShape.from_config(model.config), rows, 6, new_tokens) == expected


def test_trained_pass_is_three_forwards(tokenizer):
    model = eager_lm(tokenizer)
    ids = torch.randint(0, len(tokenizer), (2, 8))
    forward = counted(lambda: model(input_ids=ids).logits.sum())
    trained = counted(lambda: model(input_ids=ids).logits.sum().backward())
    assert trained == 3 * forward


@pytest.mark.parametrize("from_sampler", [False, True], ids=["old-logp-forward", "logprobs-from-sampler"])
def test_iteration_phases_match_the_trainer(tokenizer, tmp_path, from_sampler):
    """Every matmul of one RLTrainer iteration (rollout, scoring forwards, update) is counted."""
    from rlhf.config import RLConfig, load_config
    from rlhf.models.scalar_head import ScalarHeadModel
    from rlhf.rl.roles.assemble import assemble_roles
    from rlhf.rl.trainer import RLTrainer
    from rlhf.runtime import LocalRuntime

    policy = eager_lm(tokenizer, seed=0)
    reward_model = ScalarHeadModel.from_causal_lm(eager_lm(tokenizer, seed=2))
    config = load_config(
        RLConfig,
        preset="vanilla_ppo",
        overrides={
            "out": str(tmp_path),
            "rollout": {"batch_size": 3, "max_new_tokens": 4, "logprobs_from_sampler": from_sampler},
            # overlap off: FlopCounterMode, a dispatch mode, sees this thread's ops only
            "train": {"ppo_epochs": 2, "minibatches": 1, "micro_batch_size": 3},
            "runtime": {"overlap_critic": False},
            "log": {"sinks": []},
        },
    )
    roles = assemble_roles(config, tokenizer=tokenizer, policy=policy, reward_model=reward_model)
    prompts = [[5, 6, 7], [8, 9], [10, 11, 12, 13]]
    trainer = RLTrainer(config, LocalRuntime(roles, config.runtime), prompts, quiet=True)
    trainer.runtime.roles.policy.sampling = replace(trainer.runtime.roles.policy.sampling, stop_at_eos=False)
    with FlopCounterMode(display=False) as counter:
        experience, _ = trainer.make_experience()
    rollout_flops = counter.get_total_flops()
    with FlopCounterMode(display=False) as counter:
        trainer.update(experience, train_policy=True)
    update_flops = counter.get_total_flops()
    trainer.logger.close()

    shape = ModelShape.from_config(policy.config)
    phases = iteration_phases(
        shape,
        shape,
        shape,
        IterationShape(rows=3, prompt=4, response=4, ppo_epochs=2, old_logp_forward=not from_sampler),
    )
    assert phases["generate"] + phases["score"] + phases["forward"] == rollout_flops
    assert phases["update"] == update_flops
