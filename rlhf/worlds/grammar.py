"""The stochastic grammar of the built-in world: prompts, base responses, and which word transitions are
fluent. A base response is sentences of clauses joined by conjunctions and closed by "."; clause kinds, by
word class (SUBJ is a topic or an aspect noun, [INTENS] optional):

    copula     DET SUBJ VERB [INTENS] ADJ                   the book was really great
    aspect_of  DET ASPECT OF DET TOPIC VERB [INTENS] ADJ    the price of the book seemed fair
    pronoun    IT VERB [INTENS] ADJ                         it felt cozy
    found      I FOUND DET SUBJ [INTENS] ADJ                i found the staff friendly

A transition between word classes is fluent when the grammar can produce it (`FLUENT_TRANSITIONS`)."""

from __future__ import annotations

import random
from dataclasses import dataclass

from rlhf.worlds.vocab import FUNCTION_WORDS, Lexicon

PROMPT_TEMPLATES = (
    "review of the {topic} :",
    "write a review of the {topic} :",
    "your opinion on the {topic} :",
    "tell me about the {topic} :",
    "describe the {topic} :",
    "comment on the {topic} :",
    "thoughts on the {topic} :",
    "how was the {topic} :",
)

START, END = "START", "END"

# Class sequences of the clause kinds; "INTENS?" is optional; SUBJ is TOPIC or ASPECT.
CLAUSE_KINDS = {
    "copula": ("DET", "SUBJ", "VERB", "INTENS?", "ADJ"),
    "aspect_of": ("DET", "ASPECT", "OF", "DET", "TOPIC", "VERB", "INTENS?", "ADJ"),
    "pronoun": ("IT", "VERB", "INTENS?", "ADJ"),
    "found": ("I", "FOUND", "DET", "SUBJ", "INTENS?", "ADJ"),
}
THIS_RATE = 0.2  # "this book" instead of "the book"
TOPIC_CLAUSES = ("copula", "aspect_of", "found")  # kinds that can carry a topic
PLAIN_CLAUSES = ("copula", "pronoun", "found")  # kinds for clauses without a topic


def _fluent_transitions() -> frozenset[tuple[str, str]]:
    """Every (class, next class) pair the grammar produces, plus ADJ -> END (a missing final "." is fine)."""
    pairs: set[tuple[str, str]] = set()
    firsts: set[str] = set()
    for seq in CLAUSE_KINDS.values():
        expanded = [("TOPIC", "ASPECT") if s == "SUBJ" else (s.rstrip("?"),) for s in seq]
        optional = [s.endswith("?") for s in seq]
        firsts.update(expanded[0])
        for i in range(len(seq) - 1):
            # Successors of position i: the next position, and the one after it when the next is optional.
            j = i + 1
            while j < len(seq):
                pairs.update((a, b) for a in expanded[i] for b in expanded[j])
                if not optional[j]:
                    break
                j += 1
    for first in firsts:
        pairs.update({(START, first), ("ADV", first), ("CONJ", first), ("PERIOD", first)})
    pairs.update({(START, "ADV"), ("PERIOD", "ADV"), ("ADJ", "CONJ"), ("ADJ", "PERIOD"), ("PERIOD", END)})
    pairs.add(("ADJ", END))
    return frozenset(pairs)


FLUENT_TRANSITIONS = _fluent_transitions()


@dataclass(frozen=True)
class ResponseStyle:
    """The grammar's knobs (a view of WorldConfig, so the grammar does not depend on it)."""

    min_words: int
    max_words: int
    max_clauses: int
    topic_rate: float
    off_topic_rate: float
    positive_mood_rate: float
    negative_mood_rate: float
    mood_purity: float
    neutral_adjective_rate: float
    intensifier_rate: float
    adverb_rate: float
    sentence_break_rate: float
    repeat_rate: float


def sample_response(
    topic: str | None, lexicon: Lexicon, style: ResponseStyle, rng: random.Random
) -> list[str]:
    """One base response to a prompt about `topic`, as a list of words (no EOS).

    Whether it names the topic, names another topic, its mood and whether it repeats a clause
    are drawn first and kept while the shape is redrawn until the length fits, so the rates of
    these features are exactly the configured probabilities.
    """
    on_topic = topic is not None and rng.random() < style.topic_rate
    others = [t for t in lexicon.topics if t != topic]
    off_topic = bool(others) and rng.random() < style.off_topic_rate
    mood = _draw_mood(style, rng)
    repeat = rng.random() < style.repeat_rate
    subjects = ([topic] if on_topic else []) + ([rng.choice(others)] if off_topic else [])
    for _ in range(10_000):
        words = _draw_shape(subjects, mood, repeat, lexicon, style, rng)
        if style.min_words <= len(words) <= style.max_words:
            return words
    raise RuntimeError(  # unreachable for a validated WorldConfig (max_response_words >= 10)
        f"no base response of {style.min_words}-{style.max_words} words found; widen the length range"
    )


def _draw_mood(style: ResponseStyle, rng: random.Random) -> str:
    u = rng.random()
    if u < style.positive_mood_rate:
        return "positive"
    if u < style.positive_mood_rate + style.negative_mood_rate:
        return "negative"
    return "mixed"


def _draw_shape(
    subjects: list[str],
    mood: str,
    repeat: bool,
    lexicon: Lexicon,
    style: ResponseStyle,
    rng: random.Random,
) -> list[str]:
    n_clauses = rng.randint(max(1, len(subjects), 2 if repeat else 1), style.max_clauses)
    # Topic subjects go to distinct clauses; repeated clauses come from the drawn ones.
    n_drawn = n_clauses - 1 if repeat else n_clauses
    n_drawn = max(n_drawn, len(subjects))
    slots = rng.sample(range(n_drawn), len(subjects))
    topic_of_clause = dict(zip(slots, subjects))
    aspects = rng.sample(lexicon.aspects, len(lexicon.aspects))  # used without replacement
    used_adjectives: set[str] = set()
    clauses = []
    for i in range(n_drawn):
        subject = topic_of_clause.get(i)
        kind = rng.choice(TOPIC_CLAUSES if subject else PLAIN_CLAUSES)
        clauses.append(_clause(kind, subject, aspects, mood, used_adjectives, lexicon, style, rng))
    if repeat:
        clauses.append(list(rng.choice(clauses)))
    words: list[str] = []
    sentence_start = True
    for i, clause in enumerate(clauses):
        if sentence_start and rng.random() < style.adverb_rate:
            words.append(rng.choice(FUNCTION_WORDS["ADV"]))
        words.extend(clause)
        last = i == len(clauses) - 1
        sentence_start = last or rng.random() < style.sentence_break_rate
        words.append("." if sentence_start else rng.choice(FUNCTION_WORDS["CONJ"]))
    return words


def _clause(
    kind: str,
    topic: str | None,
    aspects: list[str],
    mood: str,
    used_adjectives: set[str],
    lexicon: Lexicon,
    style: ResponseStyle,
    rng: random.Random,
) -> list[str]:
    words = []
    for slot in CLAUSE_KINDS[kind]:
        if slot == "INTENS?":
            if rng.random() < style.intensifier_rate:
                words.append(rng.choice(FUNCTION_WORDS["INTENS"]))
        elif slot == "TOPIC" or (slot == "SUBJ" and topic is not None):
            words.append(topic)
        elif slot in ("SUBJ", "ASPECT"):
            words.append(aspects.pop() if aspects else rng.choice(lexicon.aspects))
        elif slot == "ADJ":
            words.append(_adjective(mood, used_adjectives, lexicon, style, rng))
        elif slot == "DET":
            words.append("this" if rng.random() < THIS_RATE else "the")
        else:
            words.append(rng.choice(FUNCTION_WORDS[slot]))
    return words


def _adjective(mood: str, used: set[str], lexicon: Lexicon, style: ResponseStyle, rng: random.Random) -> str:
    if rng.random() < style.neutral_adjective_rate:
        pool = lexicon.neutral
    else:
        majority = {"positive": style.mood_purity, "negative": 1 - style.mood_purity, "mixed": 0.5}[mood]
        pool = tuple(lexicon.positive if rng.random() < majority else lexicon.negative)
    fresh = [w for w in pool if w not in used] or list(pool)
    word = rng.choice(fresh)
    used.add(word)
    return word
