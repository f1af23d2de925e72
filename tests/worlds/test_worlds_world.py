"""The world: determinism, tokenizer, prompts, base responses, preference labels, written files, config."""

from __future__ import annotations

import json
import math
import random

import numpy as np
import pytest
from transformers import AutoTokenizer

from rlhf.worlds import WorldConfig, WorldConfigError, build_world, load_world
from rlhf.worlds.world import bradley_terry_label
from tests.support.worlds_testing import binomial_bound

SMALL_FILES = dict(sft_train_examples=60, sft_test_examples=20, pairs_train=50, pairs_test=30)


# --- determinism ---------------------------------------------------------------------------------
def test_same_seed_same_world_and_bytes(tmp_path):
    a = build_world(WorldConfig(seed=7, **SMALL_FILES)).write(tmp_path / "a")
    b = build_world(WorldConfig(seed=7, **SMALL_FILES)).write(tmp_path / "b")
    files = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file())
    for name in files:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


def test_sampling_is_deterministic_given_the_rng(world):
    prompt = world.train_prompts[0]
    assert world.sft_examples(30, 5) == world.sft_examples(30, random.Random(5))
    assert world.preference_pairs(20, 6) == world.preference_pairs(20, 6)
    gen = [world.sample_response(prompt, np.random.default_rng(1)) for _ in range(2)]
    assert gen[0] == gen[1]


def test_different_seeds_give_different_worlds():
    a, b = build_world(WorldConfig(seed=0)), build_world(WorldConfig(seed=1))
    assert a.lexicon.topics != b.lexicon.topics
    assert set(a.test_prompts) != set(b.test_prompts)
    assert a.sft_examples(20, 0) != b.sft_examples(20, 0)


# --- vocabulary and tokenizer --------------------------------------------------------------------
def test_default_sizes(world):
    lex, cfg = world.lexicon, world.config
    assert (len(lex.topics), len(lex.aspects), len(lex.positive), len(lex.negative), len(lex.neutral)) == (
        cfg.n_topics,
        cfg.n_aspects,
        cfg.n_positive,
        cfg.n_negative,
        cfg.n_neutral,
    )
    assert len(set(lex.words)) == len(lex.words)
    assert len(world.tokenizer) == len(lex.words) + 4  # + <pad> <unk> <bos> <eos>
    assert len(world.train_prompts) + len(world.test_prompts) == cfg.n_topics * cfg.n_templates


@pytest.mark.slow
def test_every_word_is_one_token_and_round_trips(world, tmp_path):
    tok = world.tokenizer
    world.write(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path / "tokenizer")
    specials = {tok.pad_token_id, tok.unk_token_id, tok.bos_token_id, tok.eos_token_id}
    assert len(specials) == 4 and tok.pad_token_id != tok.eos_token_id
    seen = set()
    for word in world.lexicon.words:
        ids = tok(word, add_special_tokens=False)["input_ids"]
        assert len(ids) == 1 and ids[0] not in specials, word
        assert tok.decode(ids) == word
        assert loaded(word, add_special_tokens=False)["input_ids"] == ids
        seen.add(ids[0])
    assert len(seen) == len(world.lexicon.words)
    for e in world.sft_examples(50, 0):
        for text in e.values():
            ids = loaded(text, add_special_tokens=False)["input_ids"]
            assert len(ids) == len(text.split()) and tok.unk_token_id not in ids
            assert loaded.decode(ids) == text
    assert loaded.eos_token == "<eos>" and loaded.pad_token == "<pad>"


def test_model_config_fits_the_world(world):
    cfg = world.model_config()
    assert cfg.vocab_size == len(world.tokenizer)
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads) == (64, 2, 4)
    assert (cfg.pad_token_id, cfg.eos_token_id) == (
        world.tokenizer.pad_token_id,
        world.tokenizer.eos_token_id,
    )
    assert cfg.max_position_embeddings >= world.max_prompt_tokens + 32
    assert cfg.max_position_embeddings >= world.max_prompt_tokens + world.config.max_response_words + 1
    assert world.model_config(max_new_tokens=100).max_position_embeddings >= world.max_prompt_tokens + 100


# --- prompts -------------------------------------------------------------------------------------
def test_heldout_prompts_are_disjoint_and_covered(world):
    train, test = world.train_prompts, world.test_prompts
    assert len(set(train)) == len(train) and len(set(test)) == len(test)
    assert not set(train) & set(test)
    assert len(test) == world.config.n_topics * world.config.heldout_templates_per_topic
    # Every topic, and every template, is seen in training: test prompts are new combinations.
    assert {world.topic_of(p) for p in train} == set(world.lexicon.topics)
    templates = {p.replace(world.topic_of(p), "{topic}") for p in train}
    assert {p.replace(world.topic_of(p), "{topic}") for p in test} <= templates
    assert all(p.endswith(" :") for p in train + test)


def test_no_heldout_prompts():
    world = build_world(WorldConfig(heldout_fraction=0.0))
    assert (
        world.test_prompts == []
        and len(world.train_prompts) == world.config.n_topics * world.config.n_templates
    )
    with pytest.raises(ValueError, match="no prompts"):
        world.sft_examples(1, 0, prompts=world.test_prompts)


# --- base responses ------------------------------------------------------------------------------
@pytest.mark.parametrize("topic_rate, off_topic_rate", [(0.8, 0.1), (0.3, 0.5)])
def test_base_responses_shape_and_rates(topic_rate, off_topic_rate):
    world = build_world(WorldConfig(topic_rate=topic_rate, off_topic_rate=off_topic_rate, seed=2))
    n = 3000
    examples = world.sft_examples(n, 11)
    lengths = [len(e["response"].split()) for e in examples]
    cfg = world.config
    assert min(lengths) >= cfg.min_response_words and max(lengths) <= cfg.max_response_words
    assert len(set(lengths)) >= 15  # varied length
    assert not any("<eos>" in e["response"] or e["response"] != e["response"].strip() for e in examples)
    on = np.mean([world.topic_of(e["prompt"]) in e["response"].split() for e in examples])
    topics = set(world.lexicon.topics)
    off = np.mean(
        [bool(set(e["response"].split()) & topics - {world.topic_of(e["prompt"])}) for e in examples]
    )
    assert abs(on - topic_rate) <= binomial_bound(topic_rate, n)
    assert abs(off - off_topic_rate) <= binomial_bound(off_topic_rate, n)
    # Mixed sentiment: both positive and negative words are common.
    has_pos = np.mean([any(w in world.lexicon.positive for w in e["response"].split()) for e in examples])
    has_neg = np.mean([any(w in world.lexicon.negative for w in e["response"].split()) for e in examples])
    assert 0.3 < has_pos < 0.9 and 0.3 < has_neg < 0.9


def test_response_length_range_is_respected():
    world = build_world(WorldConfig(min_response_words=12, max_response_words=16, seed=4))
    lengths = {len(world.sample_response(p, i).split()) for i, p in enumerate(world.train_prompts)}
    assert lengths <= set(range(12, 17)) and len(lengths) >= 3


# --- preference pairs ----------------------------------------------------------------------------
@pytest.mark.parametrize("tau", [0.25, 0.5, 2.0])
def test_label_agreement_matches_bradley_terry(tau):
    """Empirical agreement of labels with gold vs the analytic expectation over the drawn pairs.

    Given a pair, the label agrees with the gold ordering with probability sigmoid(|margin| / tau),
    independently across pairs: the count of agreements is Poisson-binomial.
    """
    world = build_world(WorldConfig(label_temperature=tau, seed=5))
    pairs = world.preference_pairs(3000, 8)
    margins = np.array([p["gold_margin"] for p in pairs])
    decided = np.abs(margins) > 1e-9  # a pair of equal gold (about 2% of pairs) has no "agreeing" label
    p_agree = 1 / (1 + np.exp(-np.abs(margins[decided]) / tau))
    agree = (margins[decided] > 0).sum()
    expected, sd = p_agree.sum(), math.sqrt((p_agree * (1 - p_agree)).sum())
    assert abs(agree - expected) <= 4 * sd
    for p in pairs[:200]:
        assert p["chosen"] != p["rejected"]
        assert world.gold_reward(p["prompt"], p["chosen"]) - world.gold_reward(
            p["prompt"], p["rejected"]
        ) == (pytest.approx(p["gold_margin"]))


@pytest.mark.parametrize("margin, tau", [(0.5, 0.5), (-0.3, 0.5), (2.0, 1.0), (0.0, 0.5)])
def test_bradley_terry_labeller_frequency(margin, tau):
    rng = random.Random(0)
    n = 100_000
    chosen = sum(bradley_terry_label(1.0 + margin, 1.0, tau, rng) for _ in range(n))
    p = 1 / (1 + math.exp(-margin / tau))
    assert abs(chosen / n - p) <= binomial_bound(p, n)


def test_label_noise_follows_tau():
    agreement = {}
    for tau in (0.05, 0.5, 50.0):
        margins = np.array(
            [
                p["gold_margin"]
                for p in build_world(WorldConfig(label_temperature=tau)).preference_pairs(800, 1)
            ]
        )
        agreement[tau] = np.mean(margins[np.abs(margins) > 1e-9] > 0)
    assert agreement[0.05] > 0.97 and 0.8 < agreement[0.5] < 0.95 and abs(agreement[50.0] - 0.5) < 0.08


# --- files ---------------------------------------------------------------------------------------
def _jsonl(path):
    lines = path.read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines]


def test_written_files_are_well_formed(tmp_path):
    config = WorldConfig(seed=3, **SMALL_FILES)
    world = build_world(config)
    out = world.write(tmp_path / "w")
    expected_keys = {
        "sft_train.jsonl": ({"prompt", "response"}, config.sft_train_examples, world.train_prompts),
        "sft_test.jsonl": ({"prompt", "response"}, config.sft_test_examples, world.test_prompts),
        "pairs_train.jsonl": ({"prompt", "chosen", "rejected"}, config.pairs_train, world.train_prompts),
        "pairs_test.jsonl": ({"prompt", "chosen", "rejected"}, config.pairs_test, world.test_prompts),
        "prompts_train.jsonl": ({"prompt"}, len(world.train_prompts), world.train_prompts),
        "prompts_test.jsonl": ({"prompt"}, len(world.test_prompts), world.test_prompts),
    }
    for name, (keys, count, prompts) in expected_keys.items():
        text = (out / name).read_text(encoding="utf-8")
        assert text.endswith("\n") and "\n\n" not in text, name
        records = _jsonl(out / name)
        assert len(records) == count, name
        for r in records:
            assert set(r) == keys and all(isinstance(v, str) and v for v in r.values()), (name, r)
            assert r["prompt"] in prompts, (name, r)
    assert [r["prompt"] for r in _jsonl(out / "prompts_train.jsonl")] == world.train_prompts
    assert json.loads((out / "world.json").read_text()) == config.to_dict()
    assert (out / "tokenizer" / "tokenizer.json").is_file()
    rebuilt = load_world(out)
    assert rebuilt.config == config and rebuilt.test_prompts == world.test_prompts


# --- config ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "field, value",
    [
        ("n_topics", 1000),
        ("topic_rate", 1.5),
        ("label_temperature", 0.0),
        ("max_response_words", 8),
        ("min_response_words", 30),
        ("gold_sentiment_decay", 2.0),
    ],
)
def test_invalid_config_names_the_field(field, value):
    with pytest.raises(WorldConfigError, match=field):
        WorldConfig(**{field: value})


def test_config_errors_for_files(tmp_path):
    with pytest.raises(WorldConfigError, match="unknown world parameter"):
        WorldConfig.from_dict({"n_topic": 3})
    with pytest.raises(WorldConfigError, match="cannot read"):
        WorldConfig.load(tmp_path)
    with pytest.raises(WorldConfigError, match="mood"):
        WorldConfig(positive_mood_rate=0.7, negative_mood_rate=0.5)
