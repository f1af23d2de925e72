"""Every record format, auto-detected and named, and the kind conversions and errors of each."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlhf.data import DataError, PreferenceExample, PromptExample, SFTExample, load_examples
from rlhf.data.errors import Source
from rlhf.data.formats import detect_format, parse_record, split_hh_pair

SRC = Source("f.jsonl", 7)
SYSTEM = {"role": "system", "content": "be kind"}
USER = {"role": "user", "content": "hi there"}
ASSISTANT = {"role": "assistant", "content": "hello"}
HH_PROMPT = "\n\nHuman: hi\n\nAssistant: hello\n\nHuman: how are you?\n\nAssistant:"


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


# (format, records, kind, expected examples)
CASES = [
    (
        "prompt",
        [{"prompt": "say hi"}, {"prompt": [USER]}],
        "prompt",
        [PromptExample("say hi"), PromptExample([USER])],
    ),
    (
        "sft",
        [
            {"prompt": "q1", "response": "a1"},
            {"prompt": [SYSTEM, USER], "response": "a2", "extra": 1},
        ],
        "sft",
        [SFTExample("q1", "a1"), SFTExample([SYSTEM, USER], "a2")],
    ),
    (
        "sft",
        [{"prompt": "q1", "completion": "a1"}, {"prompt": [USER], "completion": [ASSISTANT]}],
        "sft",
        [SFTExample("q1", "a1"), SFTExample([USER], "hello")],
    ),
    (
        "messages",
        [{"messages": [SYSTEM, USER, ASSISTANT]}, {"messages": [USER, ASSISTANT, USER, ASSISTANT]}],
        "sft",
        [SFTExample([SYSTEM, USER], "hello"), SFTExample([USER, ASSISTANT, USER], "hello")],
    ),
    (
        "messages",
        [{"conversations": [{"from": "human", "value": "hi there"}, {"from": "gpt", "value": "hello"}]}],
        "sft",
        [SFTExample([USER], "hello")],
    ),
    (
        "pairs",
        [
            {"prompt": "q", "chosen": "good", "rejected": "bad"},
            {
                "prompt": [USER],
                "chosen": [{"role": "assistant", "content": "good"}],
                "rejected": [{"role": "assistant", "content": "bad"}],
            },
        ],
        "preference",
        [PreferenceExample("q", "good", "bad"), PreferenceExample([USER], "good", "bad")],
    ),
    (
        "hh",
        [
            {"chosen": HH_PROMPT + " fine, thanks", "rejected": HH_PROMPT + " go away"},
            # responses sharing their start: a longest-common-prefix splitter would cut inside them
            {"chosen": HH_PROMPT + " I am fine", "rejected": HH_PROMPT + " I am busy"},
        ],
        "preference",
        [
            PreferenceExample(HH_PROMPT, "fine, thanks", "go away"),
            PreferenceExample(HH_PROMPT, "I am fine", "I am busy"),
        ],
    ),
    (
        "hh",
        [
            {
                "chosen": [USER, ASSISTANT, USER, {"role": "assistant", "content": "good"}],
                "rejected": [USER, ASSISTANT, USER, {"role": "assistant", "content": "bad"}],
            }
        ],
        "preference",
        [PreferenceExample([USER, ASSISTANT, USER], "good", "bad")],
    ),
]


@pytest.mark.parametrize("named", [False, True], ids=["auto", "named"])
@pytest.mark.parametrize("fmt,rows,kind,expected", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_every_format_parses(tmp_path, fmt, rows, kind, expected, named):
    path = write_jsonl(tmp_path / "data.jsonl", rows)
    result = load_examples(path, kind, format=fmt if named else "auto")
    assert result.format == fmt
    assert result.examples == expected
    assert result.skipped == 0
    assert [e.source for e in result.examples] == [Source(str(path), i + 1) for i in range(len(rows))]


@pytest.mark.parametrize(
    "record,fmt",
    [
        ({"prompt": "p"}, "prompt"),
        ({"prompt": "p", "response": "r"}, "sft"),
        ({"prompt": "p", "completion": "r"}, "sft"),
        ({"messages": []}, "messages"),
        ({"prompt": "p", "chosen": "c", "rejected": "r"}, "pairs"),
        ({"chosen": "c", "rejected": "r"}, "hh"),
    ],
)
def test_detect_format(record, fmt):
    assert detect_format(record, SRC) == fmt


def test_undetectable_keys_name_the_keys_and_the_formats():
    with pytest.raises(DataError) as info:
        detect_format({"question": "q", "answer": "a"}, SRC)
    message = str(info.value)
    assert message.startswith("f.jsonl:7: cannot tell the format from the keys ['answer', 'question']")
    assert "Fix:" in message and '"prompt" and "response"' in message


# --- kinds -----------------------------------------------------------------------------------------


def test_preference_and_sft_records_serve_as_prompts():
    assert parse_record(
        {"prompt": "q", "chosen": "c", "rejected": "r"}, "pairs", "prompt", SRC
    ) == PromptExample("q")
    hh = {"chosen": HH_PROMPT + " a", "rejected": HH_PROMPT + " b"}
    assert parse_record(hh, "hh", "prompt", SRC) == PromptExample(HH_PROMPT)
    assert parse_record({"prompt": "q", "response": "r"}, "sft", "prompt", SRC) == PromptExample("q")
    # a chat ending with the assistant gives the messages before it; one ending with the user gives all
    assert parse_record({"messages": [USER, ASSISTANT]}, "messages", "prompt", SRC) == PromptExample([USER])
    assert parse_record({"messages": [SYSTEM, USER]}, "messages", "prompt", SRC) == PromptExample(
        [SYSTEM, USER]
    )


def test_prompt_kind_ignores_what_it_does_not_use():
    # identical or empty responses are no problem when only the prompt is taken
    same = {"chosen": HH_PROMPT + " a", "rejected": HH_PROMPT + " a"}
    assert parse_record(same, "hh", "prompt", SRC) == PromptExample(HH_PROMPT)
    empty = {"prompt": "q", "chosen": "", "rejected": 3}
    assert parse_record(empty, "pairs", "prompt", SRC) == PromptExample("q")


def test_preference_records_serve_as_sft_with_the_chosen_response():
    record = {"chosen": HH_PROMPT + " good", "rejected": HH_PROMPT + " "}  # empty rejected is unused
    assert parse_record(record, "hh", "sft", SRC) == SFTExample(HH_PROMPT, "good")


@pytest.mark.parametrize(
    "record,fmt,kind,problem",
    [
        (
            {"prompt": "q"},
            "prompt",
            "sft",
            "a prompt-only record has no response, but sft examples are needed",
        ),
        ({"prompt": "q", "response": "r"}, "sft", "preference", "an SFT record has one response"),
        ({"messages": [USER, ASSISTANT]}, "messages", "preference", "a messages record has one response"),
        ({"messages": [SYSTEM, USER]}, "messages", "sft", "the last message of 'messages' has role 'user'"),
        ({"messages": [ASSISTANT]}, "messages", "sft", "field 'messages' has no prompt message"),
    ],
)
def test_kind_mismatch_errors(record, fmt, kind, problem):
    with pytest.raises(DataError) as info:
        parse_record(record, fmt, kind, SRC)
    assert str(info.value).startswith(f"f.jsonl:7: {problem}")
    assert "Fix:" in str(info.value)


# --- field errors ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "record,fmt,kind,problem",
    [
        ({"prompt": "q"}, "sft", "sft", "missing field 'completion'"),
        ({"prompt": "q", "response": None}, "sft", "sft", "field 'response' is null"),
        ({"prompt": "q", "response": 3}, "sft", "sft", "field 'response' must be a string, got int"),
        (
            {"prompt": 3, "response": "r"},
            "sft",
            "sft",
            "field 'prompt' must be a string or a list of messages",
        ),
        ({"prompt": "q", "response": "  \n"}, "sft", "sft", "field 'response' is empty"),
        ({"prompt": " ", "response": "r"}, "sft", "sft", "field 'prompt' is empty"),
        (
            {"prompt": [], "response": "r"},
            "sft",
            "sft",
            "field 'prompt' must be a non-empty list of messages",
        ),
        (
            {"prompt": [{"role": "user"}], "response": "r"},
            "sft",
            "sft",
            "message 0 of 'prompt' must have a string 'content'",
        ),
        (
            {"prompt": [{"content": "x"}], "response": "r"},
            "sft",
            "sft",
            "message 0 of 'prompt' must be an object",
        ),
        (
            {"prompt": "q", "chosen": [USER, ASSISTANT], "rejected": "b"},
            "pairs",
            "preference",
            "field 'chosen' must hold exactly one assistant message, got roles ['user', 'assistant']",
        ),
        (
            {"prompt": "q", "chosen": "same", "rejected": " same "},
            "pairs",
            "preference",
            "the chosen and rejected responses are identical",
        ),
        ({"prompt": "q", "chosen": "c", "rejected": ""}, "pairs", "preference", "field 'rejected' is empty"),
        (["not", "an", "object"], "sft", "sft", "a record must be a JSON object, got list"),
    ],
)
def test_field_errors_name_the_problem(record, fmt, kind, problem):
    with pytest.raises(DataError) as info:
        parse_record(record, fmt, kind, SRC)
    assert str(info.value).startswith(f"f.jsonl:7: {problem}")
    assert ". Fix: " in str(info.value)
    assert info.value.file == "f.jsonl" and info.value.line == 7


# --- HH dialogues ---------------------------------------------------------------------------------


def test_hh_split_on_hand_made_dialogues():
    prompt, chosen, rejected = split_hh_pair(
        "\n\nHuman: one\n\nAssistant: two\n\nHuman: three\n\nAssistant:  four five",
        "\n\nHuman: one\n\nAssistant: two\n\nHuman: three\n\nAssistant: six\nseven",
        SRC,
    )
    assert prompt == "\n\nHuman: one\n\nAssistant: two\n\nHuman: three\n\nAssistant:"
    assert (chosen, rejected) == ("four five", "six\nseven")
    # a preamble before the first turn belongs to the prompt
    prompt, chosen, rejected = split_hh_pair(
        "Intro.\n\nHuman: q\n\nAssistant: a", "Intro.\n\nHuman: q\n\nAssistant: b", SRC
    )
    assert (prompt, chosen, rejected) == ("Intro.\n\nHuman: q\n\nAssistant:", "a", "b")


@pytest.mark.parametrize(
    "chosen,rejected,problem",
    [
        (
            "\n\nHuman: q\n\nAssistant: a",
            "\n\nHuman: Q\n\nAssistant: b",
            "the chosen and rejected dialogues differ before their last Assistant turn (at character 9",
        ),
        (
            "\n\nHuman: q\n\nAssistant: a\n\nHuman: more\n\nAssistant: c",
            "\n\nHuman: q\n\nAssistant: b",
            "the chosen and rejected dialogues differ",
        ),
        (
            "\n\nHuman: q",
            "\n\nHuman: q\n\nAssistant: b",
            "the chosen dialogue has no '\\n\\nAssistant:' turn",
        ),
        (
            "\n\nHuman: q\n\nAssistant: a",
            "\n\nHuman: q\n\nAssistant: b\n\nHuman: c",
            "the rejected dialogue ends with a Human turn",
        ),
        ("\n\nAssistant: a", "\n\nAssistant: b", "the chosen dialogue has no Human turn"),
        ("\n\nHuman: q\n\nAssistant: a", ["x"], "fields 'chosen' and 'rejected' must both be strings"),
        (
            [USER, ASSISTANT],
            [SYSTEM, ASSISTANT],
            "the chosen and rejected dialogues differ before their last message (at message 0)",
        ),
        ([USER, ASSISTANT], [USER, USER], "field 'rejected' must end with an assistant message"),
        ([ASSISTANT], [ASSISTANT], "field 'chosen' must end with an assistant message that follows"),
    ],
)
def test_hh_split_errors(chosen, rejected, problem):
    with pytest.raises(DataError) as info:
        split_hh_pair(chosen, rejected, SRC)
    assert str(info.value).startswith(f"f.jsonl:7: {problem}")
    assert "Fix:" in str(info.value)


@pytest.mark.parametrize(
    "record,problem",
    [
        (
            {"chosen": HH_PROMPT + " a", "rejected": HH_PROMPT + "  a"},
            "the chosen and rejected responses are identical",
        ),
        (
            {"chosen": HH_PROMPT + " ", "rejected": HH_PROMPT + " b"},
            "the chosen response (after the last Assistant turn) is empty",
        ),
        (
            {"chosen": HH_PROMPT + " a", "rejected": HH_PROMPT},
            "the rejected response (after the last Assistant turn) is empty",
        ),
    ],
)
def test_hh_pairs_invalid_for_ranking(record, problem):
    with pytest.raises(DataError) as info:
        parse_record(record, "hh", "preference", SRC)
    assert str(info.value).startswith(f"f.jsonl:7: {problem}")
