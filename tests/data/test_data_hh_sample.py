"""The HH loader on the real sample: the first 1,500 pairs of HH-RLHF harmless-base (test split).

Facts of the sample (checked below): no pair has identical chosen and rejected dialogues; four
pairs have an empty chosen response (lines 87, 517, 926, 1104) and one pair's dialogues differ
before their last Assistant turn (line 1255). Those five are invalid for ranking: DataError, or
skipped with skip_invalid=True, leaving 1,495 pairs.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from rlhf.data import DataError, load_examples

# the copy the SmolLM2 recipe ships with (MIT, its LICENSE beside it): these tests run in CI too
SAMPLE = (
    Path(__file__).resolve().parents[2]
    / "examples"
    / "smollm2_hh"
    / "data"
    / "harmless-base-test-first1500.jsonl.gz"
)
INVALID_LINES = {
    87: "the chosen response",
    517: "the chosen response",
    926: "the chosen response",
    1104: "the chosen response",
    1255: "dialogues differ",
}


@pytest.fixture(scope="module")
def raw_rows() -> list[dict]:
    with gzip.open(SAMPLE, "rt", encoding="utf-8") as handle:
        return [json.loads(line) for line in handle]


@pytest.fixture(scope="module")
def pairs():
    return load_examples(SAMPLE, "preference", skip_invalid=True)


def test_sample_has_no_identical_pairs(raw_rows):
    assert len(raw_rows) == 1500
    assert sum(row["chosen"] == row["rejected"] for row in raw_rows) == 0


def test_every_valid_pair_splits_into_a_shared_prompt_and_two_responses(pairs, raw_rows):
    assert pairs.format == "hh"
    assert len(pairs.examples) == 1495
    for example in pairs.examples:
        row = raw_rows[example.source.line - 1]
        assert isinstance(example.prompt, str) and example.prompt.endswith("\n\nAssistant:")
        assert example.prompt.startswith("\n\nHuman:")
        assert example.chosen.strip() and example.rejected.strip() and example.chosen != example.rejected
        assert not example.chosen.startswith(" ") and not example.rejected.startswith(" ")
        for dialogue, response in ((row["chosen"], example.chosen), (row["rejected"], example.rejected)):
            # the dialogue is the prompt, the stripped spaces, then the response; the prompt ends at its last Assistant turn
            assert dialogue.startswith(example.prompt)
            assert dialogue[len(example.prompt) :].lstrip(" ") == response
            assert "\n\nAssistant:" not in response and "\n\nHuman:" not in response


def test_invalid_pairs_are_skipped_with_their_lines(pairs):
    assert pairs.skipped == 5
    assert {e.line: e.problem for e in pairs.errors}.keys() == INVALID_LINES.keys()
    for error in pairs.errors:
        assert INVALID_LINES[error.line] in error.problem
        assert str(error).startswith(f"{SAMPLE}:{error.line}: ")


def test_without_skipping_the_first_invalid_pair_stops_loading():
    with pytest.raises(DataError) as info:
        load_examples(SAMPLE, "preference")
    assert str(info.value).startswith(
        f"{SAMPLE}:87: the chosen response (after the last Assistant turn) is empty."
    )


def test_sample_as_prompts_and_as_sft():
    prompts = load_examples(SAMPLE, "prompt", skip_invalid=True)
    assert len(prompts.examples) == 1499 and [e.line for e in prompts.errors] == [
        1255
    ]  # empty responses are fine
    sft = load_examples(SAMPLE, "sft", skip_invalid=True)
    assert len(sft.examples) == 1495
