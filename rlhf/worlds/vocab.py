"""The words of the built-in world: pools of real English words, and the lexicon a seed draws from them.

A world uses a seeded subset of each pool (`WorldConfig.n_topics`, ...). Sentiment words carry
a strength (1.5 strong, 1.0 medium, 0.5 mild) that the gold reward weighs them by, so gold
rewards are graded and somewhat heavy-tailed rather than a count of positive words.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

TOPIC_POOL = (
    "book", "airline", "phone", "hotel", "restaurant", "movie", "laptop", "camera", "car", "bike",
    "pizza", "coffee", "museum", "park", "concert", "game", "jacket", "shoe", "printer", "tablet",
    "watch", "blender", "sofa", "garden", "gym", "bakery", "train", "ferry", "podcast", "album",
    "theater", "pharmacy", "dentist", "salon", "library", "zoo", "bank", "market", "headphones",
    "keyboard", "mattress", "tent", "backpack", "kettle", "umbrella", "cinema", "bus", "taxi",
)  # fmt: skip

ASPECT_POOL = (
    "price", "staff", "service", "design", "quality", "size", "sound", "color", "smell", "taste",
    "value", "delivery", "location", "seat", "screen", "battery", "menu", "room", "music",
    "packaging", "support", "comfort", "speed", "finish", "layout", "lighting", "portion",
    "atmosphere", "warranty", "manual", "view", "schedule",
)  # fmt: skip

# (word, strength): 1.5 strong, 1.0 medium, 0.5 mild.
POSITIVE_POOL = (
    ("excellent", 1.5), ("superb", 1.5), ("fantastic", 1.5), ("wonderful", 1.5), ("outstanding", 1.5),
    ("brilliant", 1.5), ("amazing", 1.5), ("perfect", 1.5),
    ("great", 1.0), ("lovely", 1.0), ("delightful", 1.0), ("charming", 1.0), ("cozy", 1.0),
    ("friendly", 1.0), ("reliable", 1.0), ("impressive", 1.0), ("elegant", 1.0), ("spotless", 1.0),
    ("nice", 0.5), ("good", 0.5), ("pleasant", 0.5), ("decent", 0.5), ("fine", 0.5), ("tidy", 0.5),
    ("handy", 0.5), ("fresh", 0.5), ("smooth", 0.5), ("solid", 0.5), ("clean", 0.5), ("helpful", 0.5),
)  # fmt: skip

NEGATIVE_POOL = (
    ("awful", 1.5), ("terrible", 1.5), ("horrible", 1.5), ("dreadful", 1.5), ("disgusting", 1.5),
    ("useless", 1.5), ("appalling", 1.5), ("atrocious", 1.5),
    ("bad", 1.0), ("rude", 1.0), ("broken", 1.0), ("dirty", 1.0), ("flimsy", 1.0), ("filthy", 1.0),
    ("unreliable", 1.0), ("disappointing", 1.0), ("noisy", 1.0), ("greasy", 1.0),
    ("slow", 0.5), ("bland", 0.5), ("dull", 0.5), ("stale", 0.5), ("cramped", 0.5), ("pricey", 0.5),
    ("clumsy", 0.5), ("mediocre", 0.5), ("boring", 0.5), ("awkward", 0.5), ("sticky", 0.5), ("messy", 0.5),
)  # fmt: skip

NEUTRAL_POOL = (
    "ordinary", "average", "typical", "standard", "plain", "usual", "simple", "basic", "normal",
    "regular", "small", "large", "modern", "old", "quiet", "busy",
)  # fmt: skip

# Function words of the response grammar, by grammatical class (the classes drive fluency).
FUNCTION_WORDS = {
    "DET": ("the", "this"),
    "OF": ("of",),
    "VERB": ("was", "is", "felt", "seemed", "looked"),
    "INTENS": ("very", "really", "quite", "so", "truly"),
    "IT": ("it",),
    "I": ("i",),
    "FOUND": ("found",),
    "CONJ": ("and", "but", "yet", ","),
    "ADV": ("overall", "honestly", "also"),
    "PERIOD": (".",),
}

# Word classes. ADJ covers positive, negative and neutral adjectives alike.
CONTENT_CLASSES = ("TOPIC", "ASPECT", "ADJ", "TEMPLATE", "UNK")
WORD_CLASSES = (*FUNCTION_WORDS, *CONTENT_CLASSES)


@dataclass(frozen=True, eq=False)
class Lexicon:
    """The words of one world and what each word is. Plain data: tuples and dicts of str/float."""

    topics: tuple[str, ...]
    aspects: tuple[str, ...]
    positive: dict[str, float]  # word -> strength
    negative: dict[str, float]  # word -> strength
    neutral: tuple[str, ...]
    template_words: tuple[str, ...]  # words of the prompt templates that are not function words
    classes: dict[str, str] = field(init=False, repr=False, compare=False)  # word -> class

    @property
    def adjectives(self) -> tuple[str, ...]:
        return (*self.positive, *self.negative, *self.neutral)

    @property
    def function_words(self) -> tuple[str, ...]:
        return tuple(w for words in FUNCTION_WORDS.values() for w in words)

    @property
    def words(self) -> tuple[str, ...]:
        """Every word of the world, each once, in a fixed order."""
        seen: dict[str, None] = {}
        for group in (
            self.function_words,
            self.template_words,
            self.topics,
            self.aspects,
            self.adjectives,
        ):
            seen.update(dict.fromkeys(group))
        return tuple(seen)

    def word_class(self, word: str) -> str:
        """The grammatical class of `word` ("UNK" for a word outside the world)."""
        return self.classes.get(word, "UNK")

    def is_content(self, word: str) -> bool:
        """Content words count for repetition; function words and punctuation do not."""
        return self.word_class(word) in CONTENT_CLASSES

    def __post_init__(self) -> None:
        classes: dict[str, str] = {}
        for cls, words in FUNCTION_WORDS.items():
            classes.update(dict.fromkeys(words, cls))
        classes.update(dict.fromkeys((w for w in self.template_words if w not in classes), "TEMPLATE"))
        classes.update(dict.fromkeys(self.topics, "TOPIC"))
        classes.update(dict.fromkeys(self.aspects, "ASPECT"))
        classes.update(dict.fromkeys(self.adjectives, "ADJ"))
        object.__setattr__(self, "classes", classes)


def draw_lexicon(
    rng: random.Random,
    *,
    n_topics: int,
    n_aspects: int,
    n_positive: int,
    n_negative: int,
    n_neutral: int,
    template_words: tuple[str, ...],
) -> Lexicon:
    """A seeded subset of each pool, kept in pool order (so a listing reads the same way every time)."""

    def subset(pool: tuple, k: int) -> list:
        keep = set(rng.sample(range(len(pool)), k))
        return [item for i, item in enumerate(pool) if i in keep]

    function = {w for words in FUNCTION_WORDS.values() for w in words}
    return Lexicon(
        topics=tuple(subset(TOPIC_POOL, n_topics)),
        aspects=tuple(subset(ASPECT_POOL, n_aspects)),
        positive=dict(subset(POSITIVE_POOL, n_positive)),
        negative=dict(subset(NEGATIVE_POOL, n_negative)),
        neutral=tuple(subset(NEUTRAL_POOL, n_neutral)),
        template_words=tuple(dict.fromkeys(w for w in template_words if w not in function)),
    )
