"""`WorldConfig`: every parameter of a built-in world, so that other worlds can be drawn from the family."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlhf.worlds import vocab
from rlhf.worlds.grammar import PROMPT_TEMPLATES


class WorldConfigError(ValueError):
    """An invalid world parameter; the message names the field and the fix."""


@dataclass
class WorldConfig:
    seed: int = 0  # draws the vocabulary subsets, the held-out prompts and the written data sets
    # --- vocabulary (seeded subsets of the word pools in rlhf/worlds/vocab.py)
    n_topics: int = 40  # topic nouns ("book", "airline", ...); each prompt asks about one
    n_aspects: int = 28  # aspect nouns ("price", "staff", ...) that responses comment on
    n_positive: int = 28  # positive adjectives (graded strengths 0.5 / 1.0 / 1.5)
    n_negative: int = 28  # negative adjectives (graded strengths 0.5 / 1.0 / 1.5)
    n_neutral: int = 14  # neutral adjectives ("ordinary", ...)
    # --- prompts
    n_templates: int = 6  # prompt templates used, e.g. "review of the <topic> :"
    heldout_fraction: float = (
        0.2  # of each topic's templates held out for test prompts (rounded, >= 1 if > 0)
    )
    # --- base responses (the stochastic grammar behind SFT data and preference pairs)
    min_response_words: int = 4  # shortest base response, in words (= tokens), EOS excluded
    max_response_words: int = 24  # longest base response, in words, EOS excluded
    max_clauses: int = 4  # most clauses in a base response ("the book was great" is one clause)
    topic_rate: float = 0.8  # probability that a base response names the prompt's topic
    off_topic_rate: float = 0.1  # probability that a base response names another topic
    positive_mood_rate: float = 0.4  # probability of a mostly positive response
    negative_mood_rate: float = 0.3  # probability of a mostly negative one (the rest are mixed)
    mood_purity: float = 0.85  # in a positive/negative response, share of sentiment words of that mood
    neutral_adjective_rate: float = 0.2  # probability that an adjective slot takes a neutral adjective
    intensifier_rate: float = 0.2  # probability of "very"/"really"/... before an adjective
    adverb_rate: float = 0.15  # probability that a sentence opens with "overall"/"honestly"/"also"
    sentence_break_rate: float = 0.4  # probability that a clause ends its sentence (else a conjunction)
    repeat_rate: float = 0.03  # probability that a base response repeats one of its clauses
    # --- written data sets (World.write); train sets use train prompts, test sets held-out prompts
    sft_train_examples: int = 4000  # SFT examples in sft_train.jsonl
    sft_test_examples: int = 400  # SFT examples in sft_test.jsonl
    pairs_train: int = 4000  # preference pairs in pairs_train.jsonl
    pairs_test: int = 500  # preference pairs in pairs_test.jsonl
    label_temperature: float = 0.5  # Bradley-Terry tau: P(a chosen) = sigmoid((gold_a - gold_b) / tau)
    # --- gold reward weights (rlhf/worlds/gold.py)
    gold_on_topic: float = 1.0  # bonus for naming the prompt's topic (once, however often named)
    gold_off_topic: float = 1.0  # penalty per distinct other topic named
    gold_positive: float = 1.0  # weight of positive words (strength-weighted, diminishing returns)
    gold_negative: float = 1.0  # weight of negative words (strength-weighted, diminishing returns)
    gold_sentiment_decay: float = 0.5  # the k-th strongest sentiment word counts decay**(k-1) of its strength
    gold_repeat: float = 0.5  # penalty per repeated content word and per repeated content bigram
    gold_disfluency: float = 0.5  # penalty per word transition the grammar cannot produce
    gold_length: float = 1.0  # length bonus, reached linearly at gold_length_sweet_spot words
    gold_length_sweet_spot: int = 12  # words at which the length bonus stops growing
    gold_max_good_words: int = 20  # words beyond this are penalized
    gold_excess_length: float = 0.25  # penalty per word beyond gold_max_good_words
    gold_missing_eos: float = 4.0  # penalty for a response that never ended (no EOS)
    # --- the proxy reward model as RL sees it (reward_distortion.py; the gold reward never changes).
    # Off by default. They make the raw scores badly scaled and heavy-tailed, the situation the PPO
    # paper's score reparameterization (PPO paper §5.3.1) is for.
    rm_scale: float = 1.0  # the reward model's scores are multiplied by this at RL iteration 0
    rm_scale_drift: float = 0.0  # ... and by (1 + rm_scale_drift * iteration) after: a drifting scale
    rm_outlier_rate: float = 0.0  # probability that a response's score gets a heavy-tailed error
    rm_outlier_scale: float = 10.0  # that error: rm_outlier_scale x a standard Cauchy draw

    @property
    def distorts_rewards(self) -> bool:
        """Whether RL sees the reward model's scores changed (any rm_* option away from its default)."""
        return self.rm_scale != 1.0 or self.rm_scale_drift != 0.0 or self.rm_outlier_rate > 0.0

    def __post_init__(self) -> None:
        pools = {
            "n_topics": len(vocab.TOPIC_POOL),
            "n_aspects": len(vocab.ASPECT_POOL),
            "n_positive": len(vocab.POSITIVE_POOL),
            "n_negative": len(vocab.NEGATIVE_POOL),
            "n_neutral": len(vocab.NEUTRAL_POOL),
            "n_templates": len(PROMPT_TEMPLATES),
        }
        lows = {
            "n_topics": 2,
            "n_aspects": 4,
            "n_positive": 1,
            "n_negative": 1,
            "n_neutral": 1,
            "n_templates": 1,
        }
        for name, high in pools.items():
            _check(name, getattr(self, name), lows[name], high)
        for name in (
            "topic_rate",
            "off_topic_rate",
            "positive_mood_rate",
            "negative_mood_rate",
            "mood_purity",
            "neutral_adjective_rate",
            "intensifier_rate",
            "adverb_rate",
            "sentence_break_rate",
            "repeat_rate",
        ):
            _check(name, getattr(self, name), 0.0, 1.0)
        _check("heldout_fraction", self.heldout_fraction, 0.0, 0.99)
        if self.heldout_fraction > 0 and self.n_templates < 2:
            raise WorldConfigError(
                "WorldConfig: heldout_fraction > 0 needs n_templates >= 2 (test prompts are held-out "
                "template x topic combinations); raise n_templates or set heldout_fraction = 0"
            )
        if self.positive_mood_rate + self.negative_mood_rate > 1.0:
            raise WorldConfigError(
                f"WorldConfig: positive_mood_rate + negative_mood_rate = "
                f"{self.positive_mood_rate + self.negative_mood_rate} > 1; lower one of them"
            )
        # The longest forced shape, two topics and a repeated clause, needs 15 words:
        # "the book was great and the bus was bad and the book was great ."
        _check("max_response_words", self.max_response_words, 15, 10_000)
        _check("min_response_words", self.min_response_words, 1, self.max_response_words)
        _check("max_clauses", self.max_clauses, 2, 100)
        for name in ("sft_train_examples", "sft_test_examples", "pairs_train", "pairs_test"):
            _check(name, getattr(self, name), 0, 10**9)
        if not self.label_temperature > 0:
            raise WorldConfigError(
                f"WorldConfig.label_temperature = {self.label_temperature}: must be > 0 (0.5 gives labels that "
                "agree with gold about 85% of the time)"
            )
        _check("gold_sentiment_decay", self.gold_sentiment_decay, 0.0, 1.0)
        _check("rm_scale", self.rm_scale, 1e-6, 1e6)
        _check("rm_scale_drift", self.rm_scale_drift, 0.0, 1e6)
        _check("rm_outlier_rate", self.rm_outlier_rate, 0.0, 1.0)
        _check("rm_outlier_scale", self.rm_outlier_scale, 0.0, 1e9)
        _check("gold_length_sweet_spot", self.gold_length_sweet_spot, 1, 10_000)
        _check("gold_max_good_words", self.gold_max_good_words, 1, 10_000)

    @property
    def heldout_templates_per_topic(self) -> int:
        """How many of each topic's templates are held out for test prompts."""
        if self.heldout_fraction <= 0:
            return 0
        return min(self.n_templates - 1, max(1, round(self.heldout_fraction * self.n_templates)))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any], source: str = "world config") -> WorldConfig:
        """A config from a dict (e.g. world.json); unknown keys are errors naming the key."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise WorldConfigError(
                f"{source}: unknown world parameter(s) {unknown}; valid ones are the fields of "
                "rlhf.worlds.WorldConfig"
            )
        return cls(**values)

    @classmethod
    def load(cls, path: str | Path) -> WorldConfig:
        """The config saved as world.json by `World.write` (a directory or the file itself)."""
        path = Path(path)
        if path.is_dir():
            path = path / "world.json"
        try:
            values = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as err:
            raise WorldConfigError(
                f"{path}: cannot read the world config ({err}); write it with World.write"
            ) from err
        return cls.from_dict(values, source=str(path))


def _check(name: str, value: float, low: float, high: float) -> None:
    if not low <= value <= high:
        raise WorldConfigError(f"WorldConfig.{name} = {value!r}: must lie in [{low}, {high}]")
