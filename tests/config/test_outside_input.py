"""What comes from outside the process (rlhf/config/outside.py, rlhf/config/presets.py): YAML read as
PyYAML's safe loader reads it, merge keys included, duplicate keys refused; JSON whose objects repeat a
key refused at the repeated key's line (data files too); numbers checked against float32 after the
cast, whatever their source."""

from __future__ import annotations

import json
import math

import pytest
import yaml

from rlhf.config import ConfigError, RLConfig, load_config, read_yaml
from rlhf.config.outside import FLOAT32_MAX, JSONInputError, loads, outside_number, raw_decode
from rlhf.data import DataError, load_examples

# --- YAML ------------------------------------------------------------------------------------------

MERGES = {
    "one anchor": "a: &base {x: 1, y: 2}\nb:\n  <<: *base\n  y: 3\n",
    "a list of anchors": "a: &a {x: 1}\nb: &b {x: 5, y: 2}\nc:\n  <<: [*a, *b]\n",
    "two merge keys": "a: &a {x: 1}\nb: &b {y: 2}\nc:\n  <<: *a\n  <<: *b\n  z: 0\n",
    "nested": "a: &a {x: {p: 1}}\nb:\n  <<: *a\n  w: 1\n",
    "alias and tags": "a: &v 3\nb: *v\nc: !!float 1\nd: !!str 4\n",
}


@pytest.mark.parametrize("text", MERGES.values(), ids=MERGES.keys())
def test_yaml_reads_as_pyyamls_safe_loader_reads_it(tmp_path, text):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    assert read_yaml(path) == yaml.safe_load(text)


@pytest.mark.parametrize(
    ("text", "line", "key"),
    [
        ("a: 1\nb: 2\na: 3\n", 3, "a"),
        ("base: &b {x: 1}\nc:\n  <<: *b\n  y: 1\n  y: 2\n", 5, "y"),  # a merge does not hide a duplicate
        ("g:\n  k: 1\n  k: 1\n", 3, "k"),
    ],
)
def test_yaml_still_refuses_a_key_given_twice(tmp_path, text, line, key):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=rf"c\.yaml:{line}: key {key!r} is given twice"):
        read_yaml(path)


def test_a_config_written_with_a_merge_key_loads(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(
        "policy_optim: &optim\n  lr: 2.0e-6\n  weight_decay: 0.01\ncritic_optim:\n  <<: *optim\n  lr: 5.0e-6\n"
    )
    config = load_config(RLConfig, preset="vanilla_ppo", file=str(path))
    assert (config.policy_optim.lr, config.policy_optim.weight_decay) == (2e-6, 0.01)
    assert (config.critic_optim.lr, config.critic_optim.weight_decay) == (5e-6, 0.01)


# --- JSON ------------------------------------------------------------------------------------------


def test_json_reads_as_json_loads_when_keys_are_unique():
    text = '{"a": [1, 2.5, {"b": null, "c": "x"}], "d": {"a": true}}'
    assert loads(text) == json.loads(text) and loads(text.encode()) == json.loads(text)
    assert raw_decode('  {"a": 1} tail', 2) == ({"a": 1}, 10)


@pytest.mark.parametrize(
    ("text", "key", "line", "column"),
    [
        ('{"a": 1, "a": 2}', "a", 1, 10),
        ('[1,\n {"b": {"x": 1,\n  "x": 2}}]', "x", 3, 3),  # the innermost object, at its second key
        ('{"a": {"b": 1}, "c": 2, "a": 3}', "a", 1, 25),
        ('{"k": {"k": 1}, "j": {"z": 0, "z": 0}}', "z", 1, 31),  # nested keys of one name are no duplicate
    ],
)
def test_a_json_object_that_repeats_a_key_is_refused_at_that_key(text, key, line, column):
    with pytest.raises(JSONInputError) as raised:
        loads(text)
    assert (raised.value.key, raised.value.line, raised.value.column) == (key, line, column)
    assert f"key {key!r} is given twice" in str(raised.value)


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("[" * 200_000, "nested too deeply"),
        ("1" * 5000, "a number that cannot be read"),
        (b"\xff{}", "not UTF-8"),
        ("{nope", "Expecting property name"),
    ],
)
def test_json_that_cannot_be_read_is_one_error_type(text, said):
    with pytest.raises(JSONInputError, match=said):
        loads(text)


@pytest.mark.parametrize("suffix", [".jsonl", ".json"])
def test_a_data_row_with_a_duplicated_key_stops_at_its_line_naming_the_key(tmp_path, suffix):
    rows = ['{"prompt": "a b", "response": "c"}', '{"prompt": "a", "response": "b", "prompt": "c"}']
    path = tmp_path / f"d{suffix}"
    path.write_text("\n".join(rows) + "\n" if suffix == ".jsonl" else "[\n" + ",\n".join(rows) + "\n]\n")
    with pytest.raises(DataError) as raised:
        load_examples(path, kind="sft")
    line = 2 if suffix == ".jsonl" else 3
    assert str(raised.value).startswith(f"{path}:{line}: key 'prompt' is given twice")
    assert "Fix:" in str(raised.value)


# --- numbers ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "said"),
    [
        (1e39, "1e+39, beyond float32"),
        (-1e39, "-1e+39, beyond float32"),
        (10**400, "(an integer of 401 digits), beyond float32"),
        (-(10**40), "beyond float32"),
        (math.nan, "nan, not a finite number"),
        (math.inf, "inf, not a finite number"),
        (True, "True, not a number (bool)"),
        ("3", "'3', not a number (str)"),
        (None, "None, not a number (NoneType)"),
    ],
)
def test_an_outside_number_that_float32_cannot_hold_is_named(value, said):
    with pytest.raises(ValueError) as raised:
        outside_number(value, "the source gave", "give less", ValueError)
    message = str(raised.value)
    assert (
        message.startswith("the source gave ") and said in message and message.endswith(". Fix: give less.")
    )
    with pytest.raises(ValueError) as raised:
        outside_number(
            value, "the source gave", "give less", ValueError, after=" for row 2", context=" (here)"
        )
    assert " for row 2, " in str(raised.value) and str(raised.value).endswith(" (here). Fix: give less.")


@pytest.mark.parametrize("value", [0, -3, 2.5, FLOAT32_MAX, -FLOAT32_MAX, 10**38])
def test_an_outside_number_that_float32_holds_passes_as_a_float(value):
    number = outside_number(value, "x", "y", ValueError)
    assert number == float(value) and isinstance(number, float)
