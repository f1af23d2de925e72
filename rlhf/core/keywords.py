"""A registered function called with a caller's keyword parameters (the loss and estimator
registries): a keyword it does not take is the caller's mistake, refused as a ValueError that
names the function, not as a TypeError from deep inside it."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

Out = TypeVar("Out")


def call_with_keywords(what: str, fn: Callable[..., Out], *args: object, **params: object) -> Out:
    """``fn(*args, **params)``; `what` ("policy loss 'apa'") names it when a keyword is refused."""
    try:
        return fn(*args, **params)
    except TypeError as error:
        # raised by the call itself (no frame of fn's below this one): a keyword fn does not take
        if error.__traceback__ is not None and error.__traceback__.tb_next is None:
            raise ValueError(f"{what} got a parameter it does not take: {error}") from None
        raise
