"""Datasets: formats (prompts, SFT, preference pairs, HH-RLHF, chat), loading, tokenizing, collating."""

from rlhf.data.collate import collate_pairs, collate_sft, left_pad, right_pad, token_budget_batches
from rlhf.data.errors import DataError, Source
from rlhf.data.examples import PreferenceExample, PromptExample, SFTExample
from rlhf.data.loading import LoadResult, load_examples, split_examples
from rlhf.data.tokenize import (
    TruncationStats,
    encode_pair,
    encode_prompt,
    encode_response,
    encode_sft,
    render_prompt,
)

__all__ = [
    "DataError",
    "LoadResult",
    "PreferenceExample",
    "PromptExample",
    "SFTExample",
    "Source",
    "TruncationStats",
    "collate_pairs",
    "collate_sft",
    "encode_pair",
    "encode_prompt",
    "encode_response",
    "encode_sft",
    "left_pad",
    "load_examples",
    "render_prompt",
    "right_pad",
    "split_examples",
    "token_budget_batches",
]
