"""`--agent module:function` episodes: the failure paths (an agent that raises, hangs past
agent.timeout_s or returns no number fails its episode; too many failures stop the run with exit
2 naming the function and the first error), async agents batched together, and the trainer's
experience of agent episodes: tool/user tokens carry no mask, advantage or gradient."""

from __future__ import annotations

import pytest
import torch

from rlhf.agents import AgentError, load_agent, model_backend, run_agent_episodes
from rlhf.config import AgentConfig, ConfigError
from rlhf.models.tiny import tiny_causal_lm
from tests.envs.test_envs_training import Logits, env_positions, policy_loss_of
from tests.support.agents_testing import chat_tokenizer, stop_ids
from tests.support.train_testing import rl_config

AGENTS = "tests.support.agents_testing:"


@pytest.fixture(scope="module")
def chat():
    tok = chat_tokenizer()
    model = tiny_causal_lm(tok, seed=3, hidden_size=32, num_layers=1, num_heads=2)
    return tok, model_backend(model, tok.pad_token_id, stop_ids(tok))


def run(chat, agent: str, rows, **config):
    tok, backend = chat
    return run_agent_episodes(load_agent(AGENTS + agent), backend, tok, rows, AgentConfig(**config),
                              max_new_tokens=4, max_tokens=32, return_logprobs=True)  # fmt: skip


@pytest.mark.parametrize(
    ("agent", "config", "error"),
    [
        ("raising_agent", {}, "raised RuntimeError: the tool crashed at "),
        ("hanging_agent", {"timeout_s": 0.3}, "still running after 0.3 s (agent.timeout_s)"),
        ("hanging_async_agent", {"timeout_s": 0.3}, "still running after 0.3 s (agent.timeout_s)"),
        ("wordy_agent", {}, "returned 'great' (str), not a number or a list of per-turn numbers"),
        ("huge_agent", {}, "returned the reward 1e+39, beyond float32"),
        ("huge_integer_agent", {}, "(an integer of 401 digits), beyond float32"),
    ],
)
def test_a_failing_agent_stops_the_run_naming_the_function_and_its_error(chat, agent, config, error):
    with pytest.raises(AgentError) as caught:
        run(chat, agent, [{}, {}], **config)
    message = str(caught.value)
    assert isinstance(caught.value, ConfigError)  # the CLI's exit 2
    assert message.startswith(f"agent.name {AGENTS}{agent}: 2 of 2 episodes failed") and error in message
    assert "Fix:" in message


def test_failed_episodes_below_the_fraction_get_the_failure_reward_or_are_dropped(chat):
    rows = [{"id": 0}, {"id": 1, "fail": True}, {"id": 2}, {"id": 3}]
    episodes = run(chat, "row_agent", rows, failure_reward=-1.0)
    assert episodes.rewards.tolist() == [1.0, -1.0, 1.0, 1.0] and episodes.kept.all()
    (failure,) = episodes.failures
    assert (
        failure.startswith("prompt row 1: raised ValueError: row 1 is bad at ")
        and "agents_testing.py:" in failure
    )
    assert episodes.metrics()["agent/failed_fraction"] == 0.25 and episodes.done.tolist() == [1, 0, 1, 1]
    assert episodes.rollout.response_mask[1].sum() == 0  # it sent no request: nothing to train on
    dropped = run(chat, "row_agent", rows, failure_reward=None)
    assert dropped.kept.tolist() == [True, False, True, True]
    with pytest.raises(AgentError, match="1 of 4 episodes failed, more than agent.max_failure_fraction 0.2"):
        run(chat, "row_agent", rows, max_failure_fraction=0.2)


def test_a_function_that_cannot_be_called_so_is_refused_at_load():
    for name, message in ((AGENTS + "not_called_with_three", "cannot be called as not_called_with_three(row, "),
                          ("no_colon", "name the module and the function"),
                          ("tests.support.no_such_module:f", "importing module"),
                          (AGENTS + "missing", "has no function 'missing'")):  # fmt: skip
        with pytest.raises(AgentError, match=message.replace("(", r"\(")):
            load_agent(name)


def test_async_episodes_are_decoded_together(chat):
    episodes = run(chat, "async_chat_agent", [{}, {}, {}], batch_window_ms=5000)
    counts = episodes.metrics()
    assert counts["agent/batch_size_mean"] == 3 and counts["agent/failed_fraction"] == 0
    assert episodes.rollout.response_mask.sum(-1).gt(0).all()


GROUPS = {"rollout": {"batch_size": 4, "samples_per_prompt": 2, "logprobs_from_sampler": True}}
CHAT = {"name": AGENTS + "chat_agent", "batch_window_ms": 2000}


def test_user_turns_are_context_the_policy_is_never_trained_on(make_trainer):
    trainer = make_trainer(rl_config("grpo", GROUPS, agent=CHAT, policy={"entropy_coef": 0.01}))
    experience, metrics = trainer.make_experience()
    assert metrics["agent/turns_mean"] == 2 and metrics["agent/batch_size_mean"] == 8  # 8 episodes at once
    experience = experience.select(torch.arange(experience.batch_size))
    context = env_positions(experience)
    assert context.any(), "the user's follow-up is in the rollout"
    for name in ("response_mask", "advantages", "returns"):
        assert not getattr(experience, name)[context].any(), name
    # the old log-probs are the sampler's, as recorded (logprobs_from_sampler)
    episodes = trainer.rollouts.episodes
    assert torch.equal(experience.old_logp, episodes.rollout.logprobs * episodes.rollout.response_mask)
    policy = trainer.runtime.roles.policy
    logits = Logits(policy.model.lm_head)
    policy_loss_of(policy, experience).backward()
    logits.handle.remove()
    grad = logits.grad().abs().sum(-1)
    assert (
        torch.all(grad[context] == 0.0) and (grad[experience.response_mask.bool()] > 0).float().mean() > 0.5
    )


def test_a_grpo_step_trains_on_agent_episodes(make_trainer):
    """Per-turn rewards, each at its own turn's last token (`agent.reward_placement: turn`)."""
    trainer = make_trainer(rl_config("grpo", GROUPS, agent={**CHAT, "reward_placement": "turn"},
                                     train={"iterations": 1}))  # fmt: skip
    before = [p.detach().clone() for p in trainer.runtime.roles.policy.model.parameters()]
    metrics = trainer.step()
    assert metrics["agent/turns_mean"] == 2 and metrics["agent/failed_fraction"] == 0
    episodes = trainer.rollouts.episodes  # the reward model's score plus the agent's reward
    model_scores = trainer.runtime.forward("reward_model", episodes.rollout.sequences)
    assert torch.allclose(
        torch.tensor(metrics["reward/raw_scores"]) - model_scores, episodes.rewards, atol=1e-3
    )
    mask = episodes.rollout.response_mask
    ends = (mask > 0) & (torch.nn.functional.pad(mask[:, 1:], (0, 1)) == 0)  # each turn's last token
    assert torch.equal(ends.sum(-1), episodes.turns) and not episodes.turn_rewards[~ends].any()
    assert torch.equal(episodes.turn_rewards.sum(-1), episodes.rewards)
    after = trainer.runtime.roles.policy.model.parameters()
    assert any(not torch.equal(b, p) for b, p in zip(before, after))


def test_requests_past_the_episodes_limits_are_answered_empty(chat):
    """A second turn past agent.max_turns (or a context past the policy's) gets an empty answer and
    is not recorded: the per-turn rewards then outnumber the turns, a failed episode."""
    for limit in ({"max_turns": 1}, {"max_context": 12}):
        tok, backend = chat
        config = AgentConfig(
            max_failure_fraction=1.0, **{k: v for k, v in limit.items() if k != "max_context"}
        )
        episodes = run_agent_episodes(load_agent(AGENTS + "chat_agent"), backend, tok, [{"prompt": "a b c"}],
                                      config, max_new_tokens=4, max_tokens=32,
                                      max_context=limit.get("max_context"))  # fmt: skip
        assert episodes.metrics()["agent/limited"] == 1 and episodes.turns.tolist() == [1]
        assert episodes.failures == [
            "prompt row 0: returned 2 per-turn rewards for 1 turns of its trajectory"
        ]
