"""Multi-turn episodes (`--env`) reach every scoring layer through one EpisodeRecord
(rlhf/rl/episode_record.py): DAPO's overlong penalty measures the policy's own tokens of an episode
against the episode's budget, and a reward server (`--reward-url`) is sent the episode's whole token
sequence, replies included, so that it scores what the local reward model scores."""

from __future__ import annotations

import pytest
import torch

from rlhf.config.env import response_budget
from rlhf.rl.episode_record import ENVIRONMENT, POLICY, EpisodeRecord
from rlhf.rl.remote_reward import score_request
from tests.stages.test_serve_rm import rm_dir, server  # noqa: F401  (the loopback `rlhf serve-rm`)
from tests.support.train_testing import MAX_NEW_TOKENS, rl_config

ECHO = {"name": "tests.support.envs_testing:Echo", "max_turns": 3, "max_tokens": 24}


def episode_rows(rollout) -> list[tuple[list[int], list[tuple[int, bool]]]]:
    """(prompt tokens, [(token, the policy's?)] of the response block) of each row, by a plain loop."""
    rows = []
    for i in range(rollout.input_ids.shape[0]):
        ids, real = rollout.input_ids[i].tolist(), rollout.attention_mask[i].tolist()
        prompt = [t for t, m in zip(ids[: rollout.prompt_length], real[: rollout.prompt_length]) if m]
        response = []
        for j in range(rollout.prompt_length, len(ids)):
            if real[j]:
                response.append((ids[j], bool(rollout.response_mask[i, j - rollout.prompt_length])))
        rows.append((prompt, response))
    return rows


def dapo_penalty(length: int, max_length: int, buffer: int) -> float:
    """DAPO eq. 13 (docs/algorithms.md §37), one episode at a time."""
    if length <= max_length - buffer:
        return 0.0
    return (max_length - buffer - length) / buffer if length <= max_length else -1.0


def test_the_overlong_penalty_measures_an_episodes_own_tokens_against_its_budget(make_trainer):
    factor = 0.5
    config = rl_config("vanilla_ppo", env=ECHO, rollout={"truncated": "keep"},
                       reward={"overlong_buffer": 0.5, "overlong_penalty_factor": factor})  # fmt: skip
    trainer = make_trainer(config)
    scored = trainer.rollouts.next_batch(0)
    budget = response_budget(config.env, config.rollout.max_new_tokens)
    assert budget == 24  # env.max_tokens: turns and replies together
    rows = episode_rows(scored.rollout)
    own = [sum(1 for _, mine in response if mine) for _, response in rows]
    replies = [sum(1 for _, mine in response if not mine) for _, response in rows]
    assert max(own) > MAX_NEW_TOKENS and min(replies) > 0  # several turns each, with replies
    expected = [factor * dapo_penalty(n, budget, 12) for n in own]  # L_cache = 0.5 x 24
    assert any(p < 0 for p in expected) and all(p > -factor for p in expected)  # none cut at its budget
    shaped = (scored.scores - scored.raw_scores).double().tolist()
    assert shaped == pytest.approx(expected, abs=1e-6)
    assert scored.metrics["reward/overlong_penalty"] == pytest.approx(sum(expected) / len(expected), abs=1e-6)


def test_an_episode_records_segments_are_its_turns_and_replies_in_order(make_trainer):
    trainer = make_trainer(rl_config("vanilla_ppo", env=ECHO))
    scored = trainer.rollouts.next_batch(0)
    record = EpisodeRecord(scored.rollout, 24)
    reply = trainer.runtime.tokenizer("k l m", add_special_tokens=False)["input_ids"]
    for row, (_, response) in enumerate(episode_rows(scored.rollout)):
        segments = record.segments(row)
        assert [t for _, tokens in segments for t in tokens] == [t for t, _ in response]
        assert segments[0][0] == POLICY and segments[-1][0] == POLICY  # an episode ends with a policy turn
        assert [tokens for whose, tokens in segments if whose == ENVIRONMENT] == [reply] * (
            len(segments) // 2
        )


def test_a_reward_server_scores_an_episodes_whole_sequence_as_the_local_reward_model(make_trainer, server):  # noqa: F811
    trainer = make_trainer(rl_config("vanilla_ppo", env=ECHO, reward={"remote": {"url": server.url}}))
    scored = trainer.rollouts.next_batch(0)
    episodes = trainer.rollouts.episodes
    rollout = episodes.rollout
    body = score_request(trainer.runtime.tokenizer, rollout)
    rows = episode_rows(rollout)
    assert body["prompt_ids"] == [prompt for prompt, _ in rows]
    assert body["response_ids"] == [[t for t, _ in response] for _, response in rows]  # replies included
    assert any(not mine for _, response in rows for _, mine in response)
    local = trainer.runtime.forward("reward_model", rollout.sequences).float().cpu()
    remote = trainer.scorer.remote.score(rollout)
    torch.testing.assert_close(remote, local, rtol=0, atol=1e-5)
    # the run's raw scores: the server's plus the environment's rewards
    torch.testing.assert_close(scored.raw_scores.cpu(), remote + episodes.rewards.cpu(), rtol=0, atol=1e-5)
