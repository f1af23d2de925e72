"""Diagnostics against hand counts, plus the world's diagnostics bundle."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlhf.worlds import metrics

TOPICS = {"book", "bus", "phone"}


def test_distinct_2_hand_count():
    responses = ["a b a b", "a b c", ["c", "c"], "z"]
    # bigrams: (a,b) (b,a) (a,b) | (a,b) (b,c) | (c,c) | none  -> 6 total, unique {ab, ba, bc, cc} = 4
    assert metrics.distinct_n(responses, 2) == pytest.approx(4 / 6)
    # unigrams: a b a b a b c c c z -> 10 total, unique {a, b, c, z} = 4
    assert metrics.distinct_n(responses, 1) == pytest.approx(4 / 10)
    assert metrics.distinct_n(["great great great great"], 2) == pytest.approx(1 / 3)


def test_distinct_never_crosses_responses():
    assert metrics.distinct_n(["a", "b"], 2) == 0.0  # no bigram inside either response
    assert metrics.distinct_n(["a b", "b a"], 2) == 1.0


@given(st.lists(st.lists(st.sampled_from("abcd"), max_size=8), max_size=6), st.integers(1, 3))
def test_distinct_n_equals_plain_loop(responses, n):
    grams = [tuple(r[i : i + n]) for r in responses for i in range(len(r) - n + 1)]
    expected = len(set(grams)) / len(grams) if grams else 0.0
    assert metrics.distinct_n(responses, n) == pytest.approx(expected)
    assert 0.0 <= metrics.distinct_n(responses, n) <= 1.0


def test_topic_and_off_topic_rates():
    prompts = ["review of the book :", "review of the book :", "describe the bus :", "hello :"]
    responses = ["the book was great", "the bus was bad", "the bus and the book", "the phone"]
    assert metrics.topic_rate(prompts, responses, TOPICS) == pytest.approx(2 / 4)
    assert metrics.off_topic_rate(prompts, responses, TOPICS) == pytest.approx(3 / 4)
    with pytest.raises(ValueError):
        metrics.topic_rate(prompts, responses[:2], TOPICS)


def test_repetition_rate_and_length():
    responses = ["great great great .", "the book was fine .", "", "the the cozy . cozy"]
    # 2/4 repeats; 0/5; empty 0; "the" ignored, "cozy" repeated once, "." only once: 1/5
    assert metrics.repetition_rate(responses, ignore={"the", "."}) == pytest.approx(
        (2 / 4 + 0 + 0 + 1 / 5) / 4
    )
    assert metrics.repetition_rate(responses) == pytest.approx((2 / 4 + 0 + 0 + 2 / 5) / 4)
    assert metrics.mean_length(responses) == pytest.approx((4 + 5 + 0 + 5) / 4)


def test_empty_inputs_give_zero_not_nan():
    for value in (
        metrics.distinct_n([], 2),
        metrics.topic_rate([], [], TOPICS),
        metrics.off_topic_rate([], [], TOPICS),
        metrics.repetition_rate([]),
        metrics.mean_length([]),
    ):
        assert value == 0.0
    with pytest.raises(ValueError, match="n >= 1"):
        metrics.distinct_n(["a"], 0)


def test_describe_response(full_world):
    lex = full_world.lexicon
    text = metrics.describe_response(
        "review of the book :", "the book was great and the bus was great", lex, False
    )
    assert text == "9 words, on topic, +2/-0 sentiment, 1 other topic (bus), 1 repeat, no EOS"
    assert (
        full_world.describe("describe the bus :", "it was awful .")
        == "4 words, topic not named, +0/-1 sentiment"
    )


def test_world_diagnostics(world):
    examples = world.sft_examples(64, 3)
    prompts = [e["prompt"] for e in examples]
    responses = [e["response"] for e in examples]
    stats = world.diagnostics(prompts, responses, [True] * 63 + [False])
    assert stats["gold_mean"] == pytest.approx(
        world.gold_rewards(prompts, responses, [True] * 63 + [False]).mean()
    )
    assert stats["distinct_2"] == pytest.approx(metrics.distinct_n(responses, 2))
    assert stats["topic_rate"] == pytest.approx(metrics.topic_rate(prompts, responses, world.lexicon.topics))
    assert stats["ended_rate"] == pytest.approx(63 / 64)
    assert stats["mean_length"] == pytest.approx(sum(len(r.split()) for r in responses) / 64)
    collapsed = world.diagnostics(prompts, ["the great great great great great ."] * 64)
    assert collapsed["distinct_2"] < 0.1 < stats["distinct_2"]
    assert collapsed["repetition_rate"] > 0.5 > stats["repetition_rate"]
