"""Python reward functions (docs/algorithms.md §31): the weighted sum with a reward model equals
the sum of its parts, each part is logged, the prompt file's rows reach the function, a run needs no
reward model, each failure mode stops with a message naming the function (and the row), and nothing
is imported unless named."""

from __future__ import annotations

import copy
import subprocess
import sys

import pytest
import torch

from rlhf.config import ConfigError
from rlhf.rl.reward_functions import (
    RewardFunctionError,
    load_reward_functions,
    parse_specs,
    weighted_reward,
)
from rlhf.rl.roles.assemble import assemble_roles
from rlhf.rl.trainer import RLTrainer
from rlhf.runtime import LocalRuntime
from tests.support import reward_fns_testing
from tests.support.train_testing import rl_config


def test_weighted_sum_with_the_reward_model_is_the_sum_of_the_parts(make_trainer):
    functions = [
        {"name": "tests.support.reward_fns_testing:length", "weight": 0.5},
        "tests.support.reward_fns_testing:constant",
    ]
    trainer = make_trainer(rl_config("vanilla_ppo", reward={"functions": functions, "model_weight": 2.0}))
    reward_fns_testing.CALLS.clear()
    experience, metrics = trainer.make_experience()
    with torch.no_grad():
        rm = trainer.runtime.roles.reward_model.model.score(experience.input_ids, experience.attention_mask)
    lengths = experience.response_mask.sum(1)  # the EOS is one of the tokens the function counts
    expected = 2.0 * rm + 0.5 * lengths + 0.25
    assert metrics["reward/raw_scores"] == pytest.approx([round(float(x), 4) for x in expected], abs=1e-4)
    assert metrics["reward/part/reward_model"] == pytest.approx(float((2.0 * rm).mean()), rel=1e-5)
    assert metrics["reward/part/tests.support.reward_fns_testing:length"] == pytest.approx(
        float(0.5 * lengths.mean())
    )
    assert metrics["reward/part/tests.support.reward_fns_testing:constant"] == pytest.approx(0.25)
    seen = reward_fns_testing.CALLS[0]
    assert [len(ids) for ids in seen["ids"]] == lengths.long().tolist()
    assert len(seen["prompts"]) == len(seen["responses"]) == experience.batch_size


def test_the_prompt_files_rows_reach_the_function_in_group_order(tok, prompts, _models, tmp_path):
    rows = [{"prompt": "ignored", "bonus": float(i)} for i in range(len(prompts))]
    config = rl_config(
        "vanilla_ppo",
        reward={"functions": ["tests.support.reward_fns_testing:bonus"], "model_weight": 0.0},
        rollout={"batch_size": 4, "samples_per_prompt": 2},
    )
    policy, reward_model = copy.deepcopy(_models)
    roles = assemble_roles(config, tokenizer=tok, policy=policy, reward_model=reward_model)
    trainer = RLTrainer(
        config, LocalRuntime(roles, config.runtime), prompts, run_dir=tmp_path, quiet=True, prompt_rows=rows
    )
    _, metrics = trainer.make_experience()
    picked = trainer.rollouts.prompts.last_indices
    assert metrics["reward/raw_scores"] == [float(i) for i in picked for _ in range(2)]


def test_a_run_needs_no_reward_model(tok, prompts, _models, tmp_path):
    config = rl_config(
        "grpo",
        reward={"functions": ["tests.support.reward_fns_testing:length"]},
        rollout={"batch_size": 4, "samples_per_prompt": 2},
    )
    roles = assemble_roles(config, tokenizer=tok, policy=copy.deepcopy(_models[0]), reward_model=None)
    assert roles.reward_model is None and roles.critic is None
    last = RLTrainer(
        config, LocalRuntime(roles, config.runtime), prompts, run_dir=tmp_path, quiet=True
    ).train()
    assert (
        "reward/part/reward_model" not in last
        and "reward/part/tests.support.reward_fns_testing:length" in last
    )


def test_a_critic_from_the_reward_model_needs_a_reward_model(tok, _models):
    config = rl_config("ppo_max", reward={"functions": ["tests.support.reward_fns_testing:length"]})
    with pytest.raises(ValueError, match="critic_init is reward_model but no reward model"):
        assemble_roles(config, tokenizer=tok, policy=copy.deepcopy(_models[0]), reward_model=None)


def _call(name: str):
    (function,) = load_reward_functions([name])
    prompts, responses = ["p0", "p1", "p2"], ["r0", "r1", "the third"]
    return weighted_reward(
        [function], None, 1.0, prompts, responses, [[1], [2], [3]], [{}, {}, {}], where="x, "
    )


@pytest.mark.parametrize(
    ("name", "message"),
    [
        (
            "tests.support.reward_fns_testing:raises",
            r"tests.support.reward_fns_testing:raises raised KeyError: 'no such answer'",
        ),
        (
            "tests.support.reward_fns_testing:too_short",
            r"tests.support.reward_fns_testing:too_short returned shape \(2,\) for 3 responses",
        ),
        (
            "tests.support.reward_fns_testing:nan_at_row_two",
            r"nan_at_row_two returned nan for row 2, not a finite number .*'the third'",
        ),
        (
            "tests.support.reward_fns_testing:text",
            r"tests.support.reward_fns_testing:text returned str, not numbers",
        ),
    ],
)
def test_each_failure_of_a_function_names_it(name, message):
    with pytest.raises(RewardFunctionError, match=message) as error:
        _call(name)
    assert isinstance(error.value, ConfigError)  # the CLI's user-error path: one message, exit 2


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("tests.support.reward_fns_testing", "name the module and the function, as 'module:function'"),
        ("no_such_module_xyz:f", "cannot import module 'no_such_module_xyz'"),
        ("tests.support.reward_fns_testing:missing", "has no callable 'missing'"),
        ("tests.support.reward_fns_testing:NOT_A_FUNCTION", "has no callable 'NOT_A_FUNCTION'"),
        (
            {"name": "tests.support.reward_fns_testing:length", "weight": "high"},
            "weight must be a finite number",
        ),
        ({"fn": "tests.support.reward_fns_testing:length"}, r"reward.functions\[0\] is"),
    ],
)
def test_a_bad_name_or_weight_is_a_user_error(spec, message):
    with pytest.raises(RewardFunctionError, match=message):
        load_reward_functions([spec])


def test_a_failing_function_stops_the_run_before_any_update(make_trainer):
    trainer = make_trainer(
        rl_config("vanilla_ppo", reward={"functions": ["tests.support.reward_fns_testing:nan_at_row_two"]})
    )
    before = [p.detach().clone() for p in trainer.runtime.roles.policy.model.parameters()]
    with pytest.raises(RewardFunctionError, match="iteration 0, response"):
        trainer.step()
    assert all(torch.equal(a, b) for a, b in zip(before, trainer.runtime.roles.policy.model.parameters()))


@pytest.mark.slow
def test_nothing_is_imported_unless_named(make_trainer):
    trainer = make_trainer(
        rl_config("vanilla_ppo", reward={"functions": ["tests.support.reward_fns_testing:constant"]})
    )
    trainer.step()
    assert "tests.support.reward_fns_unnamed" not in sys.modules  # it raises when imported
    assert parse_specs(["tests.support.reward_fns_unnamed:f"]) == [
        ("tests.support.reward_fns_unnamed:f", 1.0)
    ]  # parsing imports nothing
    assert "tests.support.reward_fns_unnamed" not in sys.modules
    code = (
        "import sys, rlhf.cli, rlhf.rl.trainer, rlhf.stages.train; print('rlhf.worlds.reward' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_worlds_gold_reward_as_a_function_is_the_gold_reward():
    from rlhf.worlds import WorldConfig, build_world
    from rlhf.worlds.reward import gold_reward

    world = build_world(WorldConfig())
    prompts = ["tell me about the book", "tell me about the film"]
    responses = ["it is lovely", "it is lovely but the book"]
    eos = world.tokenizer.eos_token_id
    ids = [world.tokenizer(r)["input_ids"] + [eos] for r in responses[:1]] + [
        world.tokenizer(responses[1])["input_ids"]
    ]
    got = gold_reward(prompts, responses, ids, [{}, {}])
    want = world.gold_rewards(prompts, responses, [True, False]).tolist()
    assert got == pytest.approx(want)
    assert got[0] != pytest.approx(
        world.gold_reward(prompts[0], responses[0], False)
    )  # EOS read from the ids


def _call_with(name: str, rows: list[dict]):
    (function,) = load_reward_functions([name])
    prompts, responses = ["p0", "p1", "p2"], ["a", "b", "c"]
    total, _ = weighted_reward(
        [function], None, 1.0, prompts, responses, [[1], [2, 3], []], rows, where="x, "
    )
    return function, total.tolist()


def test_a_trl_style_function_is_called_by_keyword_with_the_rows_fields():
    reward_fns_testing.CALLS.clear()
    rows = [{"prompt": "q", "answer": a, "level": i} for i, a in enumerate(["a", "x", "c"])]
    function, total = _call_with("tests.support.reward_fns_testing:trl_exact", rows)
    assert total == [1.0, 0.0, 1.0]
    seen = reward_fns_testing.CALLS[-1]
    assert seen["answer"] == ["a", "x", "c"]
    assert seen["kwargs"] == ["completion_ids", "level", "prompts"]  # not `prompt`, not the aliases


def test_the_older_names_work_as_keywords_and_a_default_covers_an_absent_field():
    function, total = _call_with("tests.support.reward_fns_testing:aliases", [{}, {}, {}])
    assert total == [8.0, 9.0, 7.0]


def test_the_four_documented_names_are_passed_by_keyword_and_other_names_are_refused_with_the_fix():
    reward_fns_testing.CALLS.clear()
    assert _call_with("tests.support.reward_fns_testing:length", [{"a": 1}, {}, {}])[1] == [1.0, 2.0, 0.0]
    assert reward_fns_testing.CALLS[-1]["rows"] == [{"a": 1}, {}, {}]
    # another function's arguments under names that are neither standard nor fields: no positional guess
    with pytest.raises(
        RewardFunctionError, match="takes 'ids', which is neither a standard argument.*Fix: add"
    ):
        _call_with("tests.support.reward_fns_testing:other_names", [{}, {}, {}])


def test_a_positional_only_signature_is_refused_with_the_fix():
    with pytest.raises(RewardFunctionError, match="positional-only.*Fix: drop the `/`"):
        load_reward_functions(["tests.support.reward_fns_testing:positional_only"])


def test_a_value_finite_in_float64_but_not_in_float32_is_refused():
    with pytest.raises(
        RewardFunctionError, match=r"overflows_float32 returned 1e\+300 for row 0, beyond float32"
    ):
        _call_with("tests.support.reward_fns_testing:overflows_float32", [{}, {}, {}])


def test_a_required_field_missing_from_a_line_is_named_before_any_call():
    from rlhf.rl.reward_functions import check_row_fields

    functions = load_reward_functions(["tests.support.reward_fns_testing:trl_exact"])
    check_row_fields(functions, [{"answer": "a"}, {"answer": "b"}], "p.jsonl")
    with pytest.raises(
        RewardFunctionError, match=r"takes 'answer'.*p.jsonl \(1 of 2 lines lack it.*Fix: add"
    ):
        check_row_fields(functions, [{"answer": "a"}, {"other": 1}], "p.jsonl")


def test_raw_values_unweighted_and_rows_counted_from_first_row():
    functions = load_reward_functions(
        [
            {"name": "tests.support.reward_fns_testing:constant", "weight": 2.0},
            "tests.support.reward_fns_testing:bonus",
        ]
    )
    raw: dict = {}
    rows = [{"bonus": 1}, {"bonus": 3}]
    total, parts = weighted_reward(
        functions, None, 1.0, ["p0", "p1"], ["r0", "r1"], [[1], [2]], rows, raw=raw
    )
    assert raw["tests.support.reward_fns_testing:constant"].tolist() == [0.25, 0.25]  # before its weight
    assert parts["tests.support.reward_fns_testing:constant"].tolist() == [0.5, 0.5]
    assert total.tolist() == [1.5, 3.5] and raw["tests.support.reward_fns_testing:bonus"].tolist() == [1, 3]
    (nan,) = load_reward_functions(["tests.support.reward_fns_testing:nan_at_row_two"])
    with pytest.raises(RewardFunctionError, match=r"returned nan for row 34, "):  # a batch from row 32 on
        weighted_reward([nan], None, 1.0, ["p"] * 3, ["r"] * 3, [[1]] * 3, [{}] * 3, first_row=32)
