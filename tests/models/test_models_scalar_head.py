"""ScalarHeadModel (reward model and critic): values, scores, save/load, critic initialization."""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoModelForCausalLM

from rlhf.models.backbone import position_ids
from rlhf.models.loading import ModelLoadingError, load_causal_lm
from rlhf.models.lora import apply_lora
from rlhf.models.scalar_head import (
    HEAD_CONFIG_NAME,
    HEAD_WEIGHTS_NAME,
    ScalarHeadModel,
    init_critic,
    last_token_index,
    response_values,
)
from tests.support.models_testing import left_pad, right_pad, rollout_batch

SEQUENCES = [[5, 6, 7, 8, 3], [9, 10, 3], [11, 12, 13, 14, 15, 16, 3]]


@pytest.fixture()
def reward_model(lm):
    torch.manual_seed(0)
    return ScalarHeadModel.from_causal_lm(lm, head_init_std=0.5)


def test_last_token_index_matches_a_loop():
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 0, 0], [1, 0, 1, 1, 0], [0, 0, 0, 0, 1]])
    expected = [max(i for i, v in enumerate(row) if v) for row in mask.tolist()]
    assert last_token_index(mask).tolist() == expected


def test_last_token_index_rejects_rows_without_tokens():
    with pytest.raises(ValueError, match=r"rows \[1\]"):
        last_token_index(torch.tensor([[1, 1], [0, 0]]))


def test_values_at_every_position_and_score_at_the_last_real_token(reward_model):
    ids, mask = right_pad(SEQUENCES, pad_id=0)
    values = reward_model(ids, mask)
    assert values.shape == ids.shape and torch.isfinite(values).all()
    scores = reward_model.score(ids, mask)
    for b, seq in enumerate(SEQUENCES):
        assert scores[b] == values[b, len(seq) - 1]
        alone = reward_model.score(torch.tensor([seq]), torch.ones(1, len(seq), dtype=torch.long))
        assert torch.allclose(scores[b], alone[0], atol=1e-5)


def test_left_and_right_padding_give_the_same_reward(reward_model):
    """docs/algorithms.md §25, point 7: the reward is read from the attention mask, not a padding side."""
    left_ids, left_mask = left_pad(SEQUENCES, pad_id=0)
    right_ids, right_mask = right_pad(SEQUENCES, pad_id=0)
    left = reward_model.score(left_ids, left_mask)
    right = reward_model.score(right_ids, right_mask)
    assert torch.allclose(left, right, atol=1e-5)
    assert left.std() > 1e-4  # the rewards differ between sequences: the check has teeth


def test_reward_with_pad_equal_to_eos_keeps_the_real_eos(lm):
    """pad id == EOS id: the mask, not the ids, finds the scored token."""
    torch.manual_seed(0)
    model = ScalarHeadModel.from_causal_lm(lm, head_init_std=0.5)
    ids, mask = right_pad(SEQUENCES, pad_id=3)
    scores = model.score(ids, mask)
    for b, seq in enumerate(SEQUENCES):
        assert scores[b] == model(ids, mask)[b, len(seq) - 1]


def test_lm_logits_are_the_causal_lms_and_come_from_the_same_forward(reward_model, lm):
    ids, mask = left_pad(SEQUENCES, pad_id=0)
    with torch.no_grad():
        expected = lm(input_ids=ids, attention_mask=mask, position_ids=position_ids(mask)).logits
        assert torch.allclose(reward_model.lm_logits(ids, mask), expected, atol=1e-5)
        both = reward_model(ids, mask, return_lm_logits=True)
        assert torch.equal(both.values, reward_model(ids, mask))
        assert torch.allclose(both.lm_logits, expected, atol=1e-5)


def test_head_initialization(lm):
    zero = ScalarHeadModel.from_causal_lm(lm, head_init_std=0.0)
    assert (zero.head.weight == 0).all() and (zero.head.bias == 0).all()
    ids, mask = right_pad(SEQUENCES, pad_id=0)
    assert (zero(ids, mask) == 0).all()
    torch.manual_seed(0)
    default = ScalarHeadModel.from_causal_lm(lm, head_init_std=None)
    std = default.head.weight.std().item()
    assert 0.3 / 33**0.5 < std < 3 / 33**0.5  # 1 / sqrt(hidden + 1), hidden = 32
    with pytest.raises(ValueError, match="head_init_std"):
        ScalarHeadModel.from_causal_lm(lm, head_init_std=-1.0)


def test_response_values_read_column_p_minus_one_plus_t(reward_model):
    ids, mask, prompt_length = rollout_batch([[5, 6], [7, 8, 9]], [[10, 11, 3], [12]], pad_id=0)
    all_values = reward_model(ids, mask)
    values = response_values(reward_model, ids, mask, prompt_length)
    assert values.shape == (2, 3)
    for b in range(2):
        for t in range(3):
            real = mask[b, prompt_length + t] == 1
            want = all_values[b, prompt_length - 1 + t] if real else torch.tensor(0.0)
            assert torch.allclose(values[b, t], want, atol=1e-6)
    with pytest.raises(ValueError, match="prompt_length"):
        response_values(reward_model, ids, mask, 0)


def test_response_values_skip_the_last_column_and_allow_no_response(reward_model):
    ids, mask, prompt_length = rollout_batch([[5, 6], [7, 8, 9]], [[10, 11, 3], [12]], pad_id=0)
    widths = []
    hook = reward_model.causal_lm.model.register_forward_pre_hook(
        lambda module, args, kwargs: widths.append(kwargs["input_ids"].shape[1]), with_kwargs=True
    )
    try:
        response_values(reward_model, ids, mask, prompt_length)
        empty = response_values(reward_model, ids[:, :prompt_length], mask[:, :prompt_length], prompt_length)
    finally:
        hook.remove()
    assert widths == [ids.shape[1] - 1]  # the value after the last token is never needed
    assert empty.shape == (2, 0)


def test_save_and_load_round_trip_without_pickle(reward_model, tmp_path):
    ids, mask = left_pad(SEQUENCES, pad_id=0)
    reward_model.save_pretrained(tmp_path)
    names = {p.name for p in tmp_path.iterdir()}
    assert {"config.json", "model.safetensors", HEAD_WEIGHTS_NAME, HEAD_CONFIG_NAME} <= names
    assert not any(n.endswith((".bin", ".pt", ".pkl", ".pth")) for n in names)
    assert json.loads((tmp_path / HEAD_CONFIG_NAME).read_text())["hidden_size"] == 32

    loaded = ScalarHeadModel.from_pretrained(tmp_path)
    assert not loaded.training
    assert torch.allclose(loaded.score(ids, mask), reward_model.score(ids, mask), atol=1e-6)

    # The directory is an ordinary Hugging Face causal LM too.
    plain = AutoModelForCausalLM.from_pretrained(tmp_path)
    with torch.no_grad():
        want = reward_model.lm_logits(ids, mask)
        got = plain(input_ids=ids, attention_mask=mask, position_ids=position_ids(mask)).logits
    assert torch.allclose(got, want, atol=1e-5)


def test_loading_a_plain_causal_lm_as_scalar_head_says_how_to_fix(lm, tmp_path):
    lm.save_pretrained(tmp_path)
    with pytest.raises(ModelLoadingError, match="from_causal_lm"):
        ScalarHeadModel.from_pretrained(tmp_path)
    fresh = ScalarHeadModel.from_causal_lm(tmp_path, head_init_std=0.0)
    assert (fresh.head.weight == 0).all()


def test_critic_from_reward_model_equals_it_on_the_scored_position(reward_model, tmp_path):
    ids, mask = left_pad(SEQUENCES, pad_id=0)
    reward_model.save_pretrained(tmp_path)
    scores = reward_model.score(ids, mask)
    last = last_token_index(mask)
    for critic in (init_critic(tmp_path), init_critic(reward_model)):
        values = critic(ids, mask)
        assert torch.allclose(values.gather(1, last[:, None]).squeeze(1), scores, atol=1e-6)
        # An independent copy: training the critic leaves the reward model alone.
        with torch.no_grad():
            critic.head.bias.add_(1.0)
        assert torch.allclose(reward_model.score(ids, mask), scores)


def test_critic_from_the_sft_model_gets_a_fresh_head(lm, tmp_path):
    lm.save_pretrained(tmp_path)
    ids, mask = left_pad(SEQUENCES, pad_id=0)
    for critic in (init_critic(tmp_path), init_critic(lm)):
        assert (critic(ids, mask) == 0).all()  # head_init_std 0 by default
        assert critic.causal_lm is not lm


def test_lora_scalar_head_trains_adapters_and_head_and_round_trips(lm, tmp_path):
    lm.save_pretrained(tmp_path / "sft")
    torch.manual_seed(0)
    model = ScalarHeadModel.from_causal_lm(load_causal_lm(tmp_path / "sft"), head_init_std=0.5)
    model = apply_lora(model, r=2, alpha=4)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert {"head.weight", "head.bias"} <= trainable
    assert all("lora_" in n or n.startswith("head.") for n in trainable)
    ids, mask = left_pad(SEQUENCES, pad_id=0)
    before = model.score(ids, mask)
    with torch.no_grad():  # make the adapter matter
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.5)
    scores = model.score(ids, mask)
    assert not torch.allclose(scores, before, atol=1e-4)

    model.save_pretrained(tmp_path / "rm")
    assert (tmp_path / "rm" / "adapter_config.json").is_file()
    for base in (None, load_causal_lm(tmp_path / "sft")):  # base from the adapter config, or given
        loaded = ScalarHeadModel.from_pretrained(tmp_path / "rm", base_model=base)
        assert torch.allclose(loaded.score(ids, mask), scores, atol=1e-5)


@settings(max_examples=10, deadline=None, derandomize=True)
@given(
    seqs=st.lists(st.lists(st.integers(4, 43), min_size=1, max_size=6), min_size=1, max_size=3),
    side=st.sampled_from(["left", "right"]),
)
def test_score_of_a_row_does_not_depend_on_its_batch(_base_lm, seqs, side):
    torch.manual_seed(0)
    model = ScalarHeadModel.from_causal_lm(_base_lm, head_init_std=0.5)
    pad = left_pad if side == "left" else right_pad
    ids, mask = pad(seqs, pad_id=0, width=7)
    batch_scores = model.score(ids, mask)
    for b, seq in enumerate(seqs):
        alone = model.score(torch.tensor([seq]), torch.ones(1, len(seq), dtype=torch.long))
        assert torch.allclose(batch_scores[b], alone[0], atol=1e-5)
