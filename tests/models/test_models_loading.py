"""Tokenizer preparation (EOS required, pad token chosen explicitly) and loading from disk."""

from __future__ import annotations

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from rlhf.models.loading import (
    ModelLoadingError,
    load_causal_lm,
    load_tokenizer,
    padding_side,
    prepare_tokenizer,
)


def make_tokenizer(vocab: list[str], **special) -> PreTrainedTokenizerFast:
    backend = Tokenizer(
        models.WordLevel({w: i for i, w in enumerate(vocab)}, unk_token=special.get("unk_token"))
    )
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=backend, **special)


def test_missing_eos_names_the_tokenizer_and_the_fix(tmp_path):
    tok = make_tokenizer(["<unk>", "a", "b"], unk_token="<unk>")
    tok.save_pretrained(tmp_path)
    with pytest.raises(ModelLoadingError, match=r"(?s)no EOS token.*eos_token") as err:
        load_tokenizer(tmp_path)
    assert str(tmp_path) in str(err.value)
    with pytest.raises(ModelLoadingError, match="my/tokenizer/dir"):
        prepare_tokenizer(make_tokenizer(["a"]), source="my/tokenizer/dir")


def test_existing_pad_token_is_kept():
    tok = make_tokenizer(
        ["<pad>", "<unk>", "</s>", "a"], pad_token="<unk>", unk_token="<unk>", eos_token="</s>"
    )
    assert prepare_tokenizer(tok).pad_token == "<unk>"


def test_pad_prefers_a_pad_token_of_the_vocabulary_then_unk_then_eos():
    with_pad = make_tokenizer(["<unk>", "</s>", "<pad>", "a"], unk_token="<unk>", eos_token="</s>")
    assert prepare_tokenizer(with_pad).pad_token_id == 2
    with_unk = make_tokenizer(["<unk>", "</s>", "a"], unk_token="<unk>", eos_token="</s>")
    assert prepare_tokenizer(with_unk).pad_token_id == 0
    eos_only = make_tokenizer(["a", "</s>"], eos_token="</s>")
    tok = prepare_tokenizer(eos_only)
    assert tok.pad_token_id == tok.eos_token_id == 1
    assert len(tok) == 2  # nothing was added to the vocabulary


def test_padding_side_is_not_assumed_and_set_only_by_the_caller():
    tok = make_tokenizer(["a", "b", "</s>"], eos_token="</s>")
    tok.padding_side = "right"
    prepare_tokenizer(tok)
    assert tok.padding_side == "right"
    with padding_side(tok, "left"):
        batch = tok(["a b", "a"], padding=True)
        assert batch["attention_mask"] == [[1, 1], [0, 1]]
    assert tok.padding_side == "right"
    with pytest.raises(ValueError, match="left"):
        with padding_side(tok, "middle"):
            pass


def test_load_round_trip_from_a_save_pretrained_directory(tmp_path, tokenizer, lm):
    tokenizer.save_pretrained(tmp_path)
    lm.save_pretrained(tmp_path)
    loaded_tok = load_tokenizer(tmp_path)
    assert loaded_tok.get_vocab() == tokenizer.get_vocab() and loaded_tok.eos_token == "<eos>"
    model = load_causal_lm(tmp_path)
    assert not model.training and next(model.parameters()).dtype == torch.float32
    ids = torch.tensor([[5, 6, 7]])
    with torch.no_grad():
        assert torch.allclose(model(input_ids=ids).logits, lm(input_ids=ids).logits)


def test_bad_paths_say_what_to_do(tmp_path):
    with pytest.raises(ModelLoadingError, match="does not exist"):
        load_causal_lm(tmp_path / "missing")
    with pytest.raises(ModelLoadingError, match="no config.json"):
        load_causal_lm(tmp_path)
    weights = tmp_path / "model.gguf"
    weights.write_bytes(b"")
    with pytest.raises(ModelLoadingError, match="gguf_file='model.gguf'"):
        load_causal_lm(weights)
    with pytest.raises(ModelLoadingError, match="not found"):
        load_tokenizer(tmp_path, gguf_file="other.gguf")


def test_a_safetensors_file_cut_short_is_named_before_loading(tmp_path):
    import struct

    from safetensors.torch import save_file

    from rlhf.models.files import check_weights_whole, damaged_safetensors
    from rlhf.models.loading import ModelLoadingError

    whole = tmp_path / "model.safetensors"
    save_file({"w": torch.arange(12.0).reshape(3, 4)}, str(whole))
    data = whole.read_bytes()
    assert damaged_safetensors(whole) is None
    (header_length,) = struct.unpack("<Q", data[:8])
    for cut, says in [
        (len(data) - 4, f"it has {len(data) - 4} bytes, its header describes {len(data)}"),  # data cut short
        (8 + header_length // 2, "too few for the header"),  # header cut short
        (5, "too few for the header"),
    ]:
        (tmp_path / "cut").mkdir(exist_ok=True)
        damaged = tmp_path / "cut" / "model.safetensors"
        damaged.write_bytes(data[:cut])
        assert says in damaged_safetensors(damaged)
        with pytest.raises(ModelLoadingError, match="model.safetensors is damaged"):
            check_weights_whole(tmp_path / "cut")
    damaged.write_bytes(struct.pack("<Q", 4) + b"{oop")
    assert "header cannot be read" in damaged_safetensors(damaged)
    check_weights_whole(tmp_path / "no-such-dir")  # a hub id: nothing to check
