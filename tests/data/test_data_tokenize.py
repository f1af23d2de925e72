"""Prompt rendering, encoding with BOS/EOS, and truncation by whole turns then tokens."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlhf.data import (
    PreferenceExample,
    SFTExample,
    TruncationStats,
    encode_pair,
    encode_prompt,
    encode_response,
    encode_sft,
    render_prompt,
)
from rlhf.data.tokenize import hh_turns, plain_chat_text
from rlhf.models.tiny import word_tokenizer

WORDS = (
    "Human: Assistant: a1 a2 b1 b2 c1 c2 d1 e1 r1 r2 r3 Intro S u1 u2 x1 user: assistant: system: w1 w2 w3 w4"
)
HH = "\n\nHuman: a1\n\nAssistant: b1 b2\n\nHuman: c1 c2\n\nAssistant: d1\n\nHuman: e1\n\nAssistant:"
TEMPLATE = "{% for m in messages %}<bos> {{ m.role }}: {{ m.content }} {% endfor %}{% if add_generation_prompt %}assistant:{% endif %}"


@pytest.fixture(scope="module")
def tok():
    return word_tokenizer([WORDS])


@pytest.fixture(scope="module")
def bos_tok():
    return word_tokenizer([WORDS], add_bos=True)


def ids(tokenizer, words: str) -> list[int]:
    return [tokenizer.convert_tokens_to_ids(w) for w in words.split()]


# --- rendering ------------------------------------------------------------------------------------


def test_render_string_and_plain_messages(tok):
    assert render_prompt(tok, HH) == HH
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "u1"}]
    assert render_prompt(tok, messages) == "system: S\n\nuser: u1\n\nassistant:"
    assert plain_chat_text(messages, add_generation_prompt=False) == "system: S\n\nuser: u1"


def test_chat_template_is_used_and_bos_is_not_doubled():
    tokenizer = word_tokenizer([WORDS], add_bos=True)
    tokenizer.chat_template = TEMPLATE
    messages = [{"role": "user", "content": "u1"}]
    assert render_prompt(tokenizer, messages) == "<bos> user: u1 assistant:"
    assert encode_prompt(tokenizer, messages) == ids(tokenizer, "<bos> user: u1 assistant:")
    # a string prompt still gets the tokenizer's BOS
    assert encode_prompt(tokenizer, "u1") == ids(tokenizer, "<bos> u1")
    # ... unless the text already starts with it
    assert encode_prompt(tokenizer, "<bos> u1") == ids(tokenizer, "<bos> u1")


def test_chat_template_errors_are_explained():
    tokenizer = word_tokenizer([WORDS])
    tokenizer.chat_template = "{{ raise_exception('roles must alternate') }}"
    with pytest.raises(
        ValueError, match="chat template rejected the prompt messages .*roles must alternate.*Fix:"
    ):
        render_prompt(tokenizer, [{"role": "user", "content": "u1"}])


def test_hh_turns_roundtrip():
    preamble, turns = hh_turns("Intro" + HH)
    assert preamble == "Intro"
    assert turns[0] == "\n\nHuman: a1" and turns[-1] == "\n\nAssistant:" and len(turns) == 6
    assert "".join([preamble, *turns]) == "Intro" + HH
    assert hh_turns("w1 w2") == ("w1 w2", [])


# --- prompt truncation ----------------------------------------------------------------------------


def test_prompt_that_fits_is_untouched(tok):
    stats = TruncationStats()
    full = ids(tok, "Human: a1 Assistant: b1 b2 Human: c1 c2 Assistant: d1 Human: e1 Assistant:")
    assert len(full) == 13
    assert encode_prompt(tok, HH, 13, stats) == full == encode_prompt(tok, HH)
    assert stats == TruncationStats(prompts=1)


@pytest.mark.parametrize(
    "budget,expected,turns_dropped",
    [
        # drop the oldest exchange (Human a1 + Assistant b1 b2) as a whole: 13 -> 8 tokens
        (12, "Human: c1 c2 Assistant: d1 Human: e1 Assistant:", 2),
        (8, "Human: c1 c2 Assistant: d1 Human: e1 Assistant:", 2),
        # then the next exchange; the last Human turn and the cue are never dropped
        (7, "Human: e1 Assistant:", 4),
        (3, "Human: e1 Assistant:", 4),
    ],
)
def test_prompt_drops_oldest_whole_turns(tok, budget, expected, turns_dropped):
    stats = TruncationStats()
    assert encode_prompt(tok, HH, budget, stats) == ids(tok, expected)
    assert stats == TruncationStats(
        prompts=1, prompts_turns_dropped=1, turns_dropped=turns_dropped, prompts_truncated=1
    )


def test_prompt_left_truncates_after_dropping_turns(tok, bos_tok):
    stats = TruncationStats()
    assert encode_prompt(tok, HH, 2, stats) == ids(tok, "e1 Assistant:")
    assert stats == TruncationStats(
        prompts=1, prompts_turns_dropped=1, turns_dropped=4, prompts_left_truncated=1, prompts_truncated=1
    )
    # the BOS survives left truncation
    assert encode_prompt(bos_tok, HH, 3) == ids(bos_tok, "<bos> e1 Assistant:")
    assert encode_prompt(bos_tok, HH, 4) == ids(bos_tok, "<bos> Human: e1 Assistant:")
    with pytest.raises(ValueError, match="leaves no room for the prompt after its BOS"):
        encode_prompt(bos_tok, HH, 1)


def test_preamble_is_kept_and_plain_text_left_truncates(tok):
    stats = TruncationStats()
    assert encode_prompt(tok, "Intro" + HH, 4, stats) == ids(tok, "Intro Human: e1 Assistant:")
    assert encode_prompt(tok, "w1 w2 w3 w4", 2, stats) == ids(tok, "w3 w4")
    assert stats == TruncationStats(
        prompts=2, prompts_turns_dropped=1, turns_dropped=4, prompts_left_truncated=1, prompts_truncated=2
    )


def test_messages_drop_oldest_exchanges_and_keep_the_system_message(tok):
    system = {"role": "system", "content": "S"}
    u1, a1, u2 = (
        {"role": "user", "content": "u1"},
        {"role": "assistant", "content": "a1"},
        {"role": "user", "content": "u2"},
    )
    stats = TruncationStats()
    # "system: S user: u1 assistant: a1 user: u2 assistant:" is 9 tokens
    assert len(encode_prompt(tok, [system, u1, a1, u2])) == 9
    kept = encode_prompt(tok, [system, u1, a1, u2], 8, stats)
    assert kept == ids(tok, "system: S user: u2 assistant:")
    assert kept == encode_prompt(tok, [system, u2])
    assert stats.turns_dropped == 2 and stats.prompts_left_truncated == 0


def test_prompt_budget_must_be_positive_and_prompt_non_empty(tok):
    with pytest.raises(ValueError, match="max_tokens must be at least 1"):
        encode_prompt(tok, "w1", 0)
    with pytest.raises(ValueError, match="encodes to no token"):
        encode_prompt(tok, "   ")


@settings(max_examples=60, deadline=None)
@given(
    turns=st.lists(
        st.tuples(
            st.sampled_from(["a1", "b1 b2", "c1 c2 d1", "e1"]), st.sampled_from(["r1", "r2 r3", "w1 w2 w3"])
        ),
        min_size=1,
        max_size=5,
    ),
    budget=st.integers(1, 30),
)
def test_truncated_prompt_fits_and_keeps_the_end(tok, turns, budget):
    prompt = (
        "".join(f"\n\nHuman: {h}\n\nAssistant: {a}" for h, a in turns[:-1])
        + f"\n\nHuman: {turns[-1][0]}\n\nAssistant:"
    )
    full = encode_prompt(tok, prompt)
    stats = TruncationStats()
    kept = encode_prompt(tok, prompt, budget, stats)
    assert len(kept) <= budget
    assert kept == full[len(full) - len(kept) :]  # a suffix of the prompt: the generation cue stays last
    if len(full) <= budget:
        assert kept == full and stats == TruncationStats(prompts=1)
    elif stats.prompts_left_truncated == 0:
        assert tok.decode(kept).startswith("Human:")  # only whole exchanges were dropped


# --- responses ------------------------------------------------------------------------------------


def test_response_gets_eos_and_keeps_it_when_truncated(tok):
    eos = tok.eos_token_id
    stats = TruncationStats()
    assert encode_response(tok, "r1 r2 r3", None, stats) == ids(tok, "r1 r2 r3") + [eos]
    assert encode_response(tok, "r1 r2 r3", 4, stats) == ids(tok, "r1 r2 r3") + [eos]
    assert encode_response(tok, "r1 r2 r3", 3, stats) == ids(tok, "r1 r2") + [eos]
    assert encode_response(tok, "r1 r2 r3", 1, stats) == [eos]
    assert stats == TruncationStats(responses=4, responses_truncated=2)
    assert encode_response(tok, "r1 r2 <eos>") == ids(tok, "r1 r2") + [eos]  # no second EOS
    with pytest.raises(ValueError, match="room for EOS"):
        encode_response(tok, "r1", 0)


def test_response_has_no_bos(bos_tok):
    assert encode_response(bos_tok, "r1") == ids(bos_tok, "r1 <eos>")


def test_tokenizer_without_eos_is_a_clear_error():
    tokenizer = word_tokenizer([WORDS])
    tokenizer.eos_token = None
    with pytest.raises(ValueError, match="the tokenizer has no EOS token.*Fix: set tokenizer.eos_token"):
        encode_response(tokenizer, "r1")


def test_encode_sft_and_pair(bos_tok):
    stats = TruncationStats()
    prompt, response = encode_sft(bos_tok, SFTExample("\n\nHuman: a1\n\nAssistant:", "r1 r2"), 8, 8, stats)
    assert (prompt, response) == (ids(bos_tok, "<bos> Human: a1 Assistant:"), ids(bos_tok, "r1 r2 <eos>"))
    pair = PreferenceExample("w1 w2", "r1 r2 r3", "r1 r2 w4")
    prompt, chosen, rejected = encode_pair(bos_tok, pair, 8, 8, stats)
    assert (prompt, chosen, rejected) == (
        ids(bos_tok, "<bos> w1 w2"),
        ids(bos_tok, "r1 r2 r3 <eos>"),
        ids(bos_tok, "r1 r2 w4 <eos>"),
    )
    assert stats.pairs_identical_after_truncation == 0
    _, chosen, rejected = encode_pair(bos_tok, pair, 8, 3, stats)  # both become "r1 r2 <eos>"
    assert chosen == rejected == ids(bos_tok, "r1 r2 <eos>")
    assert stats == TruncationStats(
        prompts=3, responses=5, responses_truncated=2, pairs_identical_after_truncation=1
    )


def test_stats_merge_and_summary():
    a = TruncationStats(
        prompts=10,
        prompts_turns_dropped=3,
        turns_dropped=5,
        prompts_left_truncated=1,
        prompts_truncated=4,
        responses=20,
        responses_truncated=2,
    )
    b = TruncationStats(prompts=1, responses=2, responses_truncated=1, pairs_identical_after_truncation=1)
    a.merge(b)
    assert a.as_dict() == {
        "prompts": 11,
        "prompts_turns_dropped": 3,
        "turns_dropped": 5,
        "prompts_left_truncated": 1,
        "prompts_truncated": 4,
        "prompts_truncated_share": 4 / 11,
        "responses": 22,
        "responses_truncated": 3,
        "pairs_identical_after_truncation": 1,
    }
    assert a.summary() == (
        "prompts 4/11 truncated (36.4%): 3/11 had turns dropped (5 turns), 1/11 left-truncated; responses 3/22 truncated; "
        "1 pairs identical after truncation"
    )


@pytest.mark.parametrize(
    ("prompts", "budget", "truncated"),
    [
        (["w1 w2", "Human: e1 Assistant:", "w1"], 8, 0),  # none loses anything
        (["w1 w2 w3 w4", HH, "\n\nHuman: a1 b1 b2 c1\n\nAssistant:"], 2, 3),  # every one does
        ([HH], 4, 1),  # a batch of one: its turns dropped
        ([HH], 40, 0),
        (["w1 w2 w3 w4", HH, "w1 w2 w3", HH, "w1"], 3, 3),  # tokens cut once, turns (and text) twice
    ],
)
def test_truncated_share_matches_a_hand_count(tok, prompts, budget, truncated):
    stats = TruncationStats()
    for prompt in prompts:
        encode_prompt(tok, prompt, budget, stats)
    assert (stats.prompts, stats.prompts_truncated) == (len(prompts), truncated)
    assert stats.as_dict()["prompts_truncated_share"] == truncated / len(prompts)
    # a prompt counts once, whether it lost turns, text or both
    assert stats.prompts_truncated <= stats.prompts_turns_dropped + stats.prompts_left_truncated
    assert TruncationStats().prompts_truncated_share is None  # nothing encoded: no share
