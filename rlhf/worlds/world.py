"""`World`: a synthetic language task with a known gold reward, built deterministically from a `WorldConfig`.

    world = build_world(WorldConfig(seed=0))
    world.write("runs/demo/world")      # tokenizer/, sft_*.jsonl, pairs_*.jsonl, prompts_*.jsonl, world.json
    world.gold_rewards(prompts, responses, ended)

Text conventions: words are separated by single spaces and the tokenizer is word-level, so one
word is one token. Prompts end with ":". Responses are plain text without EOS; the data layer
appends the tokenizer's EOS token, and `ended_with_eos` tells the gold reward whether it was there.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from transformers import LlamaConfig, PreTrainedTokenizerFast

from rlhf.models.tiny import tiny_llama_config, word_tokenizer
from rlhf.worlds import metrics
from rlhf.worlds.config import WorldConfig
from rlhf.worlds.gold import GoldReward, GoldWeights, prompt_topic
from rlhf.worlds.grammar import PROMPT_TEMPLATES, ResponseStyle, sample_response
from rlhf.worlds.vocab import Lexicon, draw_lexicon

RNG = random.Random | np.random.Generator | int | None
Response = str | Sequence[str] | Sequence[int]


def as_random(rng: RNG) -> random.Random:
    """A `random.Random` from a Random (used as is), a numpy Generator (seeds one) or an int seed."""
    if isinstance(rng, random.Random):
        return rng
    if isinstance(rng, np.random.Generator):
        return random.Random(int(rng.integers(2**63)))
    return random.Random(rng)


class World:
    """The built-in world: vocabulary and tokenizer, prompts, base responses, gold reward, data sets."""

    def __init__(
        self, config: WorldConfig, lexicon: Lexicon, train_prompts: list[str], test_prompts: list[str]
    ):
        self.config = config
        self.lexicon = lexicon
        self.train_prompts = train_prompts
        self.test_prompts = test_prompts
        self.tokenizer: PreTrainedTokenizerFast = word_tokenizer([" ".join(sorted(lexicon.words))])
        self.gold = GoldReward(lexicon, gold_weights(config))
        self.style = ResponseStyle(
            min_words=config.min_response_words,
            max_words=config.max_response_words,
            max_clauses=config.max_clauses,
            topic_rate=config.topic_rate,
            off_topic_rate=config.off_topic_rate,
            positive_mood_rate=config.positive_mood_rate,
            negative_mood_rate=config.negative_mood_rate,
            mood_purity=config.mood_purity,
            neutral_adjective_rate=config.neutral_adjective_rate,
            intensifier_rate=config.intensifier_rate,
            adverb_rate=config.adverb_rate,
            sentence_break_rate=config.sentence_break_rate,
            repeat_rate=config.repeat_rate,
        )

    # --- prompts and responses -------------------------------------------------------------------
    def topic_of(self, prompt: str) -> str | None:
        """The topic a prompt asks about (None if it names none)."""
        return prompt_topic(prompt, self.lexicon)

    @property
    def max_prompt_tokens(self) -> int:
        """Tokens in the longest prompt (one word = one token, no BOS)."""
        return max(len(p.split()) for p in self.train_prompts + self.test_prompts)

    def sample_response(self, prompt: str, rng: RNG) -> str:
        """One base response to `prompt` (plain text, no EOS)."""
        return " ".join(sample_response(self.topic_of(prompt), self.lexicon, self.style, as_random(rng)))

    def sft_examples(self, n: int, rng: RNG, prompts: Sequence[str] | None = None) -> list[dict[str, str]]:
        """`n` examples {"prompt", "response"}: prompts drawn uniformly from `prompts` (default: train)."""
        rng = as_random(rng)
        prompts = self._prompts(prompts)
        out = []
        for _ in range(n):
            prompt = rng.choice(prompts)
            out.append({"prompt": prompt, "response": self.sample_response(prompt, rng)})
        return out

    def preference_pairs(
        self, n: int, rng: RNG, prompts: Sequence[str] | None = None
    ) -> list[dict[str, Any]]:
        """`n` labelled pairs {"prompt", "chosen", "rejected", "gold_margin"}.

        Two different base responses to one prompt; the first is chosen with the Bradley-Terry
        probability sigmoid((gold_a - gold_b) / label_temperature), so labels are noisy as human
        labels are. `gold_margin` = gold(chosen) - gold(rejected) (< 0 where the label disagrees).
        """
        rng = as_random(rng)
        prompts = self._prompts(prompts)
        tau = self.config.label_temperature
        out = []
        for _ in range(n):
            prompt = rng.choice(prompts)
            a = self.sample_response(prompt, rng)
            b = self.sample_response(prompt, rng)
            while b == a:
                b = self.sample_response(prompt, rng)
            gold_a, gold_b = self.gold(prompt, a), self.gold(prompt, b)
            if bradley_terry_label(gold_a, gold_b, tau, rng):
                out.append({"prompt": prompt, "chosen": a, "rejected": b, "gold_margin": gold_a - gold_b})
            else:
                out.append({"prompt": prompt, "chosen": b, "rejected": a, "gold_margin": gold_b - gold_a})
        return out

    def _prompts(self, prompts: Sequence[str] | None) -> Sequence[str]:
        prompts = self.train_prompts if prompts is None else prompts
        if not prompts:
            raise ValueError(
                "World: no prompts to draw from (the test set is empty when heldout_fraction = 0)"
            )
        return prompts

    # --- gold reward -----------------------------------------------------------------------------
    def gold_reward(self, prompt: str, response: Response, ended_with_eos: bool = True) -> float:
        """The gold reward of one response: text, a list of words, or a list of token ids (see `words`)."""
        return self.gold(prompt, self.words(response), ended_with_eos)

    def gold_rewards(
        self, prompts: Sequence[str], responses: Sequence[Response], ended: Sequence[bool] | None = None
    ) -> np.ndarray:
        """Gold rewards of a batch (vectorised), float64 [B]; `ended` defaults to all True."""
        return self.gold.batch(prompts, [self.words(r) for r in responses], ended)

    def words(self, response: Response) -> list[str]:
        """The words of a response given as text, words, or token ids (pad/BOS/EOS ids are dropped)."""
        if isinstance(response, str):
            return response.split()
        items = response.tolist() if hasattr(response, "tolist") else list(response)
        if items and not isinstance(items[0], str):
            tok = self.tokenizer
            special = {tok.pad_token_id, tok.bos_token_id, tok.eos_token_id}
            return tok.convert_ids_to_tokens([int(i) for i in items if int(i) not in special])
        return items

    # --- diagnostics -----------------------------------------------------------------------------
    def diagnostics(
        self, prompts: Sequence[str], responses: Sequence[Response], ended: Sequence[bool] | None = None
    ) -> dict[str, float]:
        """The monitors' statistics of a set of responses: gold, diversity, topic, repetition, length."""
        word_lists = [self.words(r) for r in responses]
        gold = self.gold.batch(prompts, word_lists, ended)
        function_words = set(self.lexicon.function_words)
        return {
            "gold_mean": float(gold.mean()) if len(gold) else 0.0,
            "gold_std": float(gold.std()) if len(gold) else 0.0,
            "distinct_1": metrics.distinct_n(word_lists, 1),
            "distinct_2": metrics.distinct_n(word_lists, 2),
            "topic_rate": metrics.topic_rate(prompts, word_lists, self.lexicon.topics),
            "off_topic_rate": metrics.off_topic_rate(prompts, word_lists, self.lexicon.topics),
            "repetition_rate": metrics.repetition_rate(word_lists, ignore=function_words),
            "mean_length": metrics.mean_length(word_lists),
            "ended_rate": float(np.mean(ended)) if ended is not None and len(ended) else 1.0,
        }

    def describe(self, prompt: str, response: Response, ended_with_eos: bool = True) -> str:
        """A short description of a response's features, for the report's sample tables."""
        return metrics.describe_response(prompt, self.words(response), self.lexicon, ended_with_eos)

    # --- model and files -------------------------------------------------------------------------
    def model_config(
        self, *, hidden_size: int = 64, num_layers: int = 2, num_heads: int = 4, max_new_tokens: int = 32
    ) -> LlamaConfig:
        """The recommended tiny Llama for this world, sized to the vocabulary; positions cover the
        longest prompt plus max(max_new_tokens, the longest base response + EOS), rounded up to 32."""
        needed = self.max_prompt_tokens + max(max_new_tokens, self.config.max_response_words + 1)
        tok = self.tokenizer
        return tiny_llama_config(
            len(tok),
            hidden_size=hidden_size,
            num_layers=num_layers,
            num_heads=num_heads,
            max_positions=32 * math.ceil(needed / 32),
            pad_token_id=tok.pad_token_id,
            bos_token_id=tok.bos_token_id,
            eos_token_id=tok.eos_token_id,
        )

    def write(self, directory: str | Path) -> Path:
        """Write the world's files (overwriting): the data sets are drawn from fixed seeds derived from
        config.seed, so the same config always writes the same bytes. Returns the directory."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.tokenizer.save_pretrained(str(directory / "tokenizer"))
        cfg, seed = self.config, self.config.seed
        files = {
            "prompts_train.jsonl": [{"prompt": p} for p in self.train_prompts],
            "prompts_test.jsonl": [{"prompt": p} for p in self.test_prompts],
            "sft_train.jsonl": self.sft_examples(cfg.sft_train_examples, random.Random(f"{seed}/sft_train")),
            "sft_test.jsonl": self.sft_examples(
                cfg.sft_test_examples,
                random.Random(f"{seed}/sft_test"),
                self.test_prompts or self.train_prompts,
            ),
            "pairs_train.jsonl": _strip_gold(
                self.preference_pairs(cfg.pairs_train, random.Random(f"{seed}/pairs_train"))
            ),
            "pairs_test.jsonl": _strip_gold(
                self.preference_pairs(
                    cfg.pairs_test,
                    random.Random(f"{seed}/pairs_test"),
                    self.test_prompts or self.train_prompts,
                )
            ),
        }
        for name, records in files.items():
            with open(directory / name, "w", encoding="utf-8") as f:
                f.writelines(json.dumps(r) + "\n" for r in records)
        (directory / "world.json").write_text(json.dumps(cfg.to_dict(), indent=2) + "\n")
        return directory


def gold_weights(config: WorldConfig) -> GoldWeights:
    """The gold_* fields of a WorldConfig as GoldWeights."""
    return GoldWeights(**{f.name: getattr(config, "gold_" + f.name) for f in dataclasses.fields(GoldWeights)})


def build_world(config: WorldConfig | None = None) -> World:
    """The world of `config` (default WorldConfig()); deterministic given config.seed."""
    config = config or WorldConfig()
    rng = random.Random(f"{config.seed}/world")
    templates = PROMPT_TEMPLATES[: config.n_templates]
    template_words = tuple(w for t in templates for w in t.split() if w != "{topic}")
    lexicon = draw_lexicon(
        rng,
        n_topics=config.n_topics,
        n_aspects=config.n_aspects,
        n_positive=config.n_positive,
        n_negative=config.n_negative,
        n_neutral=config.n_neutral,
        template_words=template_words,
    )
    # Held-out prompts: topic i (in a shuffled order) holds out h consecutive templates starting at
    # start + i*h (mod n), so each template is held out for about as many topics as the others and
    # stays in train with the rest.
    n, h = len(templates), config.heldout_templates_per_topic
    order = rng.sample(lexicon.topics, len(lexicon.topics))
    start = rng.randrange(n)
    held = {topic: {(start + i * h + k) % n for k in range(h)} for i, topic in enumerate(order)}
    train, test = [], []
    for topic in lexicon.topics:
        for j, template in enumerate(templates):
            (test if j in held[topic] else train).append(template.format(topic=topic))
    return World(config, lexicon, train, test)


def load_world(path: str | Path) -> World:
    """Rebuild the world whose world.json is at `path` (a directory written by `World.write`, or the file)."""
    return build_world(WorldConfig.load(path))


def _strip_gold(pairs: list[dict[str, Any]]) -> list[dict[str, str]]:
    return [{"prompt": p["prompt"], "chosen": p["chosen"], "rejected": p["rejected"]} for p in pairs]


def bradley_terry_label(gold_a: float, gold_b: float, tau: float, rng: random.Random) -> bool:
    """Whether a labeller prefers a over b: True with probability sigmoid((gold_a - gold_b) / tau)."""
    return rng.random() < _sigmoid((gold_a - gold_b) / tau)


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))
