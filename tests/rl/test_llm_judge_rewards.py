"""The LLM judge as a reward source of `rlhf train` and `reward.weights` (docs/algorithms.md §31):
the raw score is the weighted sum of the reward model's, the judge's and the functions' scores,
each source's raw mean and each weighted part logged; a response whose reply holds no score is
dropped (trains nothing) and counted; a wrong number of weights is refused naming the sources."""

from __future__ import annotations

import pytest
import torch

from rlhf.config import ConfigError, RLConfig
from rlhf.config.reward_sources import check_reward_weights, reward_sources
from tests.support.openai_judge import OpenAIJudge, between, length_rater
from tests.support.train_testing import rl_config

LENGTH = "tests.support.reward_fns_testing:length"
CONSTANT = "tests.support.reward_fns_testing:constant"


@pytest.fixture(scope="module")
def server():
    judge = OpenAIJudge()
    yield judge
    judge.close()


def judge_settings(url: str) -> dict:
    return {"url": url, "model": "judge-7b", "concurrency": 1, "retries": 0}  # one at a time: in row order


def words_of_response(content: str) -> float:
    return float(len(between(content, "[Response]\n", "\n\nReply with").split()))


def test_the_weighted_sum_of_reward_model_judge_and_function(make_trainer, server):
    server.requests.clear()

    def first_unparsable(content: str) -> str:  # the first response's reply holds no score
        return "I would rather not say." if len(server.requests) == 1 else length_rater(content)

    server.reply = first_unparsable
    reward = {
        "llm_judge": judge_settings(server.url),
        "functions": [LENGTH, CONSTANT],
        "weights": [0.5, 2.0, 0.1, -1.0],
    }
    trainer = make_trainer(
        rl_config("vanilla_ppo", reward=reward, model={"reward_model": "rm"})
    )  # the fixture's
    try:
        experience, metrics = trainer.make_experience()
    finally:
        server.reply = length_rater
    with torch.no_grad():
        rm = trainer.runtime.roles.reward_model.model.score(experience.input_ids, experience.attention_mask)
    judged = torch.tensor([words_of_response(c) for c in server.contents()])
    judged[0] = 0.0  # dropped: its part is 0, its response trains nothing
    lengths = experience.response_mask.sum(
        1
    )  # the tokens the function counts (row 0's mask zeroed: not compared)
    raw = torch.tensor(metrics["reward/raw_scores"], dtype=torch.float64)
    expected = 0.5 * rm.double() + 2.0 * judged.double() + 0.1 * lengths.double() - 0.25
    assert len(judged) == experience.batch_size
    assert raw[1:].tolist() == pytest.approx(expected[1:].tolist(), abs=1e-4)
    assert metrics["judge/unparsable"] == 1
    assert metrics["rollout/kept_fraction"] == pytest.approx(1 - 1 / experience.batch_size)
    assert (
        float(experience.response_mask[0].sum()) == 0 and float(experience.response_mask[1:].sum(1).min()) > 0
    )
    assert metrics["reward/source/llm_judge"] == pytest.approx(float(judged[1:].mean()))  # the scored rows
    assert metrics["reward/part/llm_judge"] == pytest.approx(float(2.0 * judged.mean()))
    assert metrics["reward/source/reward_model"] == pytest.approx(float(rm.mean()), rel=1e-5)
    assert metrics["reward/part/reward_model"] == pytest.approx(float(0.5 * rm.mean()), rel=1e-5)
    assert metrics[f"reward/source/{CONSTANT}"] == pytest.approx(0.25)
    assert metrics[f"reward/part/{CONSTANT}"] == pytest.approx(-0.25)
    assert "Rate how well the response answers" in server.contents()[0]  # the built-in template


def sources_config(**reward) -> RLConfig:
    config = RLConfig()
    config.model.reward_model = "runs/rm"
    config.reward.llm_judge.url = "http://127.0.0.1:8000/v1"
    for key, value in reward.items():
        setattr(config.reward, key, value)
    return config


def test_weights_follow_the_sources_in_order_and_a_wrong_count_is_refused():
    config = sources_config(functions=[LENGTH, {"name": CONSTANT}], weights=[1.0, 0.5])
    assert [name for name, _ in reward_sources(config)] == ["reward_model", "llm_judge", LENGTH, CONSTANT]
    with pytest.raises(ConfigError) as raised:
        check_reward_weights(config)
    said = str(raised.value)
    assert said.startswith("reward.weights holds 2 weights for 4 reward sources (1. --reward-model runs/rm, ")
    assert (
        f"3. --reward-fn {LENGTH}, 4. --reward-fn {CONSTANT})" in said
        and raised.value.key == "reward.weights"
    )
    check_reward_weights(sources_config(functions=[LENGTH], weights=[1, 2, 3]))
    check_reward_weights(sources_config(model_weight=3.0))  # no weights: each source's own, as before
    with pytest.raises(ConfigError, match="reward.model_weight .3. both weigh the reward model"):
        check_reward_weights(sources_config(weights=[1, 2], model_weight=3.0))
    with pytest.raises(ConfigError, match=f"entry {CONSTANT} both weigh that function"):
        check_reward_weights(sources_config(functions=[{"name": CONSTANT, "weight": 2}], weights=[1, 2, 3]))
    with pytest.raises(ConfigError, match="not a list of finite numbers"):
        check_reward_weights(sources_config(weights=[1, float("nan")]))


def test_judge_keys_without_a_url_are_refused_as_inapplicable():
    with pytest.raises(ConfigError, match=r"reward.llm_judge.model.*--judge-url URL is given"):
        rl_config("vanilla_ppo", reward={"llm_judge": {"model": "m"}})
    with pytest.raises(ConfigError, match=r"reward.llm_judge.model is empty.*Fix: --judge-model NAME"):
        rl_config("vanilla_ppo", reward={"llm_judge": {"url": "http://127.0.0.1:1/v1"}})
    with pytest.raises(ConfigError, match=r"reward.llm_judge.url 'ftp://x' is not an http"):
        rl_config("vanilla_ppo", reward={"llm_judge": {"url": "ftp://x", "model": "m"}})
