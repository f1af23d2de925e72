"""Diagnostics of a set of responses, for the demo's monitors and report (pure functions).

A response is text (words separated by whitespace) or a list of words. Every function returns
0.0 on an empty input rather than NaN.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Sequence

from rlhf.worlds.vocab import Lexicon

Words = str | Sequence[str]


def _words(response: Words) -> list[str]:
    return response.split() if isinstance(response, str) else list(response)


def distinct_n(responses: Sequence[Words], n: int = 2) -> float:
    """Unique n-grams / total n-grams over a set of responses (n-grams never cross responses).

    Collapse into one repeated pattern drives it towards 0; varied text keeps it near 1.
    """
    if n < 1:
        raise ValueError(f"distinct_n: n = {n}; n-grams need n >= 1")
    grams = Counter()
    for response in responses:
        words = _words(response)
        grams.update(tuple(words[i : i + n]) for i in range(len(words) - n + 1))
    total = sum(grams.values())
    return len(grams) / total if total else 0.0


def _prompt_topic(prompt: str, topics: Collection[str]) -> str | None:
    return next((w for w in prompt.split() if w in topics), None)


def topic_rate(prompts: Sequence[str], responses: Sequence[Words], topics: Collection[str]) -> float:
    """Fraction of responses that name their prompt's topic (the prompt's first word in `topics`)."""
    topics = set(topics)
    hits = [_prompt_topic(p, topics) in set(_words(r)) for p, r in zip(prompts, responses, strict=True)]
    return sum(hits) / len(hits) if hits else 0.0


def off_topic_rate(prompts: Sequence[str], responses: Sequence[Words], topics: Collection[str]) -> float:
    """Fraction of responses that name a topic other than their prompt's."""
    topics = set(topics)
    hits = [
        bool((set(_words(r)) & topics) - {_prompt_topic(p, topics)})
        for p, r in zip(prompts, responses, strict=True)
    ]
    return sum(hits) / len(hits) if hits else 0.0


def repetition_rate(responses: Sequence[Words], ignore: Collection[str] = ()) -> float:
    """Mean over responses of the fraction of words that repeat an earlier word of the same response.

    Words in `ignore` (e.g. function words, punctuation) never count as repeats but do count in
    the length. An empty response has rate 0.
    """
    rates = []
    for response in responses:
        words = _words(response)
        seen: set[str] = set()
        repeats = 0
        for word in words:
            if word in seen and word not in ignore:
                repeats += 1
            seen.add(word)
        rates.append(repeats / len(words) if words else 0.0)
    return sum(rates) / len(rates) if rates else 0.0


def mean_length(responses: Sequence[Words]) -> float:
    """Mean number of words (= tokens in the built-in world, EOS excluded)."""
    return sum(len(_words(r)) for r in responses) / len(responses) if responses else 0.0


def describe_response(prompt: str, response: Words, lexicon: Lexicon, ended_with_eos: bool = True) -> str:
    """A short description of a response's features, e.g.
    "9 words, on topic, +2/-0 sentiment, 1 other topic (bus), 3 repeats, no EOS"."""
    words = _words(response)
    topic = _prompt_topic(prompt, lexicon.topics)
    positive = sum(w in lexicon.positive for w in words)
    negative = sum(w in lexicon.negative for w in words)
    others = sorted({w for w in words if lexicon.word_class(w) == "TOPIC"} - {topic})
    repeats = sum(c - 1 for w, c in Counter(words).items() if lexicon.is_content(w))
    parts = [
        f"{len(words)} word{'s' * (len(words) != 1)}",
        "on topic" if topic in words else "topic not named",
        f"+{positive}/-{negative} sentiment",
    ]
    if others:
        parts.append(f"{len(others)} other topic{'s' * (len(others) > 1)} ({', '.join(others)})")
    if repeats:
        parts.append(f"{repeats} repeat{'s' * (repeats > 1)}")
    if not ended_with_eos:
        parts.append("no EOS")
    return ", ".join(parts)
