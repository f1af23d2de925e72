"""The gold reward: the documented ordering, each term against a hand count, and batch == loop."""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlhf.worlds import WorldConfig, build_world, gold_reward
from tests.support.worlds_testing import binomial_bound

PROMPT = "review of the book :"
SWEET = 12  # default gold_length_sweet_spot


def gold(world, response, ended=True, prompt=PROMPT):
    return world.gold_reward(prompt, response, ended)


def test_documented_ordering_and_values(full_world):
    """The ordering and values in rlhf/worlds/gold.py's docstring (default weights)."""
    ranked = [
        ("the book was great and the staff was friendly .", True, 1 + (1 + 0.5) + 10 / SWEET),
        ("the book was ordinary .", True, 1 + 5 / SWEET),
        ("the staff was ordinary .", True, 5 / SWEET),
        ("the airline was ordinary .", True, -1 + 5 / SWEET),
        # great x5: sentiment 1+1/2+1/4+1/8+1/16; 4 repeated words + 3 repeated "great great"; 4 ADJ->ADJ
        ("the book was great great great great great .", True, 1 + 1.9375 - 0.5 * 7 - 0.5 * 4 + 9 / SWEET),
        ("the book was ordinary .", False, 1 + 5 / SWEET - 4.0),
    ]
    values = [gold(full_world, text, ended) for text, ended, _ in ranked]
    assert values == pytest.approx([expected for _, _, expected in ranked], abs=1e-9)
    assert all(a > b for a, b in zip(values, values[1:]))
    # The vectorised version ranks them the same way, with the same values.
    batch = full_world.gold_rewards(
        [PROMPT] * len(ranked), [t for t, _, _ in ranked], [e for _, e, _ in ranked]
    )
    np.testing.assert_allclose(batch, values, atol=1e-12)


def test_positive_words_have_diminishing_returns(full_world):
    """Each further distinct positive word of equal strength adds decay**(k-1): same length, fluency, no repeats."""
    positives = ["great", "lovely", "delightful", "charming"]  # all strength 1.0
    neutrals = ["ordinary", "average", "typical", "standard"]
    assert all(full_world.lexicon.positive[w] == 1.0 for w in positives)

    def response(k):
        adj = positives[:k] + neutrals[k:]
        return f"the book was {adj[0]} and the staff was {adj[1]} and the price was {adj[2]} and the room was {adj[3]} ."

    values = [gold(full_world, response(k)) for k in range(5)]
    gains = np.diff(values)
    np.testing.assert_allclose(gains, [0.5**k for k in range(4)], atol=1e-12)
    assert values[-1] - values[0] < 1.0 / (1 - 0.5)  # bounded by strength / (1 - decay)


def test_repeating_a_positive_word_soon_loses(full_world):
    """'great' once is good; each further 'great' gains less than its repetition costs."""
    values = [
        gold(full_world, "the book was " + " and it was ".join(["great"] * k) + " .") for k in range(1, 6)
    ]
    assert values[1] < values[0]  # the second "great" adds 0.5 but costs a repeated word and two bigrams
    assert all(a > b for a, b in zip(values, values[1:]))


def test_strength_is_graded(full_world):
    strong, medium, mild = "excellent", "great", "nice"
    values = [gold(full_world, f"the book was {w} .") for w in (strong, medium, mild)]
    np.testing.assert_allclose(np.diff(values), [-0.5, -0.5], atol=1e-12)
    neg = [gold(full_world, f"the book was {w} .") for w in ("awful", "bad", "slow")]
    np.testing.assert_allclose(np.diff(neg), [0.5, 0.5], atol=1e-12)


def test_off_topic_penalty_counts_distinct_topics(full_world):
    base = gold(full_world, "the book was ordinary .")
    one = gold(full_world, "the book was ordinary and the bus was ordinary .")
    # one other topic; "ordinary" and "was ordinary" repeated once each; 5 more words of length
    assert one == pytest.approx(base - 1.0 - 0.5 * 2 + 5 / SWEET)
    two = gold(full_world, "the book was ordinary and the bus was plain and the taxi was simple .")
    mentioned_twice = gold(full_world, "the book was ordinary and the bus was plain and the bus was simple .")
    assert two == pytest.approx(
        mentioned_twice + 0.5 * 3 - 1.0
    )  # bus twice: 1 word + 2 bigram repeats, 1 topic less


def test_topic_bonus_counts_once(full_world):
    once = gold(full_world, "the book was great and it was ordinary .")
    twice = gold(full_world, "the book was great and the book was ordinary .")
    # the second "book" earns nothing and costs 1 repeated word + 2 repeated bigrams ("the book", "book was")
    assert twice == pytest.approx(once + 1 / SWEET - 0.5 * 3)


def test_length_bonus_and_excess_penalty(full_world):
    """Length helps linearly up to the sweet spot, is flat until max_good_words, then costs per word."""
    adjectives = ["ordinary", "average", "typical", "standard", "plain", "usual", "simple", "basic", "normal"]
    aspects = ["price", "staff", "design", "size", "color", "menu", "room", "seat", "view"]
    values, lengths = [], []
    for k in range(1, 10):
        text = "the book was ordinary ." + "".join(
            f" the {aspects[i]} was {adjectives[i]} ." for i in range(1, k)
        )
        lengths.append(len(text.split()))
        values.append(gold(full_world, text) - 1.0)  # minus the topic bonus: only length remains
    expected = [min(n, SWEET) / SWEET - 0.25 * max(0, n - 20) for n in lengths]
    np.testing.assert_allclose(values, expected, atol=1e-12)
    assert lengths[-1] > 30


def test_missing_eos_costs_exactly_its_weight(world):
    rng = random.Random(0)
    for _ in range(50):
        prompt = rng.choice(world.train_prompts)
        response = world.sample_response(prompt, rng)
        assert gold(world, response, False, prompt) == pytest.approx(
            gold(world, response, True, prompt) - 4.0
        )


def test_empty_response_is_poor(full_world):
    # no words: no topic, START -> END is not fluent
    assert gold(full_world, "") == pytest.approx(-0.5)
    assert gold(full_world, "") < gold(full_world, "the book was ordinary .")


def test_base_responses_are_fluent_and_rarely_repetitive(world):
    """The grammar produces only fluent transitions, and repeats only in the injected repeated clauses."""
    rng = random.Random(1)
    examples = world.sft_examples(3000, rng)
    weights = world.gold.weights
    strict_fluency = dataclasses.replace(weights, disfluency=1000.0)
    strict_repeats = dataclasses.replace(weights, repeat=1000.0)
    repetitive = 0
    for e in examples:
        plain = world.gold_reward(e["prompt"], e["response"])
        assert gold_reward(e["prompt"], e["response"], True, world.lexicon, strict_fluency) == pytest.approx(
            plain
        )
        repetitive += gold_reward(e["prompt"], e["response"], True, world.lexicon, strict_repeats) != plain
    rate = world.config.repeat_rate
    assert abs(repetitive / len(examples) - rate) <= binomial_bound(rate, len(examples))


def test_token_ids_equal_text(world):
    tok = world.tokenizer
    rng = random.Random(2)
    for _ in range(20):
        prompt = rng.choice(world.train_prompts)
        text = world.sample_response(prompt, rng)
        ids = tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id, tok.pad_token_id]
        assert world.gold_reward(prompt, ids) == world.gold_reward(prompt, text)
        assert world.gold_rewards([prompt], [np.array(ids)])[0] == world.gold_reward(prompt, text)


def test_batch_input_errors(world):
    with pytest.raises(ValueError, match="one of each per response"):
        world.gold_rewards(["a :"], ["x", "y"])
    assert world.gold_rewards([], []).shape == (0,)


_HYPOTHESIS_WORLD = build_world(WorldConfig(seed=3))


@st.composite
def batches(draw):
    """Random word sequences over the world's words plus an unknown word, with random EOS flags."""
    world = _HYPOTHESIS_WORLD
    words = [*world.lexicon.words, "zebra"]
    size = draw(st.integers(1, 6))
    prompts = draw(
        st.lists(st.sampled_from(world.train_prompts + ["hello there :"]), min_size=size, max_size=size)
    )
    # Small alphabets per response make repeats and topic mentions frequent.
    responses = []
    for _ in range(size):
        alphabet = draw(st.lists(st.sampled_from(words), min_size=1, max_size=5))
        responses.append(draw(st.lists(st.sampled_from(alphabet), max_size=30)))
    ended = draw(st.lists(st.booleans(), min_size=size, max_size=size))
    return world, prompts, responses, ended


@settings(max_examples=150, deadline=None)
@given(batches())
def test_batch_equals_plain_loop(case):
    world, prompts, responses, ended = case
    batch = world.gold_rewards(prompts, responses, ended)
    loop = [
        gold_reward(p, r, e, world.lexicon, world.gold.weights) for p, r, e in zip(prompts, responses, ended)
    ]
    np.testing.assert_allclose(batch, loop, atol=1e-9)
    # A row's value does not depend on the other rows (their lengths set the padding width).
    single = world.gold_rewards(prompts[:1], responses[:1], ended[:1])
    np.testing.assert_allclose(single, batch[:1], atol=1e-9)
    assert np.isfinite(batch).all()


def test_generated_responses_batch_equals_loop(world):
    rng = random.Random(4)
    examples = world.sft_examples(1000, rng)
    prompts = [e["prompt"] for e in examples]
    responses = [e["response"] for e in examples]
    ended = [rng.random() < 0.8 for _ in examples]
    loop = [world.gold_reward(p, r, e) for p, r, e in zip(prompts, responses, ended)]
    np.testing.assert_allclose(world.gold_rewards(prompts, responses, ended), loop, atol=1e-9)
