"""Helpers shared by the world tests."""

from rlhf.worlds import vocab

FULL_POOLS = dict(
    n_topics=len(vocab.TOPIC_POOL),
    n_aspects=len(vocab.ASPECT_POOL),
    n_positive=len(vocab.POSITIVE_POOL),
    n_negative=len(vocab.NEGATIVE_POOL),
    n_neutral=len(vocab.NEUTRAL_POOL),
)


def binomial_bound(p: float, n: int, sigmas: float = 4.0) -> float:
    """Half-width of a normal-approximation confidence interval of a binomial rate p over n draws."""
    return sigmas * (p * (1 - p) / n) ** 0.5
