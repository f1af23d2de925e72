"""Sequence packing (`train.packing`, rlhf/models/packing.py): a forward's sequences laid end to end,
positions restarting, attention kept within each sequence, outputs put back in the padded layout.
Log-probs, entropies, values, reward scores, the SFT/DPO sums and their gradients equal the padded
path's at atol 1e-5 in float32, on a Llama and a Qwen2 (and GPT-2: learned absolute positions),
left-padded RL rows and right-padded supervised rows, with a batch of one, rows of very different
lengths and a fully masked row. Tiny models built from configs: nothing is downloaded."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import AutoModelForCausalLM, GPT2Config, LlamaConfig, MambaConfig, Qwen2Config

from rlhf.config import ConfigError
from rlhf.models.backbone import decoder_hidden_states
from rlhf.models.logprobs import response_logprobs
from rlhf.models.packing import PACKING_ATTRIBUTE, enable_packing, first_fit, pack, packing_refusal
from rlhf.models.scalar_head import ScalarHeadModel, response_values
from rlhf.train.lm_loss import model_token_nll, sequence_logprobs
from rlhf.train.setup import with_packing

ATOL = 1e-5
VOCAB = 40


def config(arch: str):
    if arch == "llama":
        return LlamaConfig(
            vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        )  # fmt: skip
    if arch == "qwen2":
        return Qwen2Config(
            vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        )  # fmt: skip
    return GPT2Config(
        vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64, bos_token_id=0, eos_token_id=0
    )


def pair(arch: str, attention: str = "sdpa"):
    """(padded model, the same weights packing)."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config(arch), attn_implementation=attention).eval()
    packed = copy.deepcopy(model)
    enable_packing(packed)
    return model, packed


def rl_batch(lengths: list[tuple[int, int]], prompt: int, response: int):
    """Left-padded prompts + right-padded responses of (prompt, response) real lengths."""
    generator = torch.Generator().manual_seed(len(lengths))
    ids = torch.randint(1, VOCAB, (len(lengths), prompt + response), generator=generator)
    mask = torch.zeros_like(ids)
    for r, (p, t) in enumerate(lengths):
        mask[r, prompt - p : prompt] = 1
        mask[r, prompt : prompt + t] = 1
    return ids, mask


def right_batch(lengths: list[int], width: int):
    generator = torch.Generator().manual_seed(width + len(lengths))
    ids = torch.randint(1, VOCAB, (len(lengths), width), generator=generator)
    mask = torch.zeros_like(ids)
    for r, n in enumerate(lengths):
        mask[r, :n] = 1
    return ids, mask


RL_CASES = {
    "padding": [(3, 4), (5, 2), (1, 6), (4, 4)],
    "one row": [(4, 5)],
    "very different": [(1, 1), (9, 12), (2, 1), (1, 2)],
    "masked row": [(3, 3), (0, 0), (5, 1)],
}
ARCHS = ["llama", "qwen2", "gpt2"]


def grads(model) -> list[torch.Tensor]:
    out = [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    return out


def assert_grads_close(a, b) -> None:
    for x, y in zip(grads(a), grads(b)):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=ATOL)  # large sums: relative rounding


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("case", list(RL_CASES))
def test_response_logprobs_and_entropies_equal_the_padded_paths(arch, case):
    model, packed = pair(arch)
    ids, mask = rl_batch(RL_CASES[case], prompt=9, response=12)
    valid = mask[:, 9:].bool()
    expected = response_logprobs(model, ids, mask, 9, temperature=0.7, with_entropy=True)
    got = response_logprobs(packed, ids, mask, 9, temperature=0.7, with_entropy=True)
    for e, g in zip(expected, got):
        torch.testing.assert_close(g[valid], e[valid], rtol=0, atol=ATOL)
        assert not bool(g[~valid].any())  # 0 at padding, as the padded path
    (expected[0].sum() + expected[1].sum()).backward()
    (got[0].sum() + got[1].sum()).backward()
    assert_grads_close(model, packed)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("case", list(RL_CASES))
def test_values_and_reward_scores_equal_the_padded_paths(arch, case):
    model, packed = pair(arch)
    torch.manual_seed(1)
    critic = ScalarHeadModel.from_causal_lm(model)
    packed_critic = ScalarHeadModel.from_causal_lm(packed)
    packed_critic.head.load_state_dict(critic.head.state_dict())
    ids, mask = rl_batch(RL_CASES[case], prompt=9, response=12)
    valid = mask[:, 9:].bool()
    expected = response_values(critic, ids, mask, 9)
    got = response_values(packed_critic, ids, mask, 9)
    torch.testing.assert_close(got[valid], expected[valid], rtol=0, atol=ATOL)
    expected.sum().backward()
    got.sum().backward()
    assert_grads_close(critic, packed_critic)
    scored = mask.any(1)  # a reward needs a real token
    torch.testing.assert_close(
        packed_critic.score(ids[scored], mask[scored]),
        critic.score(ids[scored], mask[scored]),
        rtol=0,
        atol=ATOL,
    )


SUPERVISED_CASES = {
    "padding": [7, 3, 11, 5],
    "one row": [6],
    "very different": [1, 14, 2],
    "masked row": [5, 0, 9],
}


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("case", list(SUPERVISED_CASES))
def test_sft_nll_and_dpo_sums_of_right_padded_rows_equal_the_padded_paths(arch, case):
    model, packed = pair(arch)
    ids, mask = right_batch(SUPERVISED_CASES[case], width=14)
    loss_mask = mask.clone()
    loss_mask[:, :2] = 0  # the prompt's columns
    nll, count = model_token_nll(model, ids, mask, loss_mask)
    packed_nll, packed_count = model_token_nll(packed, ids, mask, loss_mask)
    assert packed_count == count
    torch.testing.assert_close(packed_nll, nll, rtol=0, atol=ATOL * max(count, 1))
    nll.backward()
    packed_nll.backward()
    assert_grads_close(model, packed)
    sums = sequence_logprobs(model, ids, mask, loss_mask)
    torch.testing.assert_close(sequence_logprobs(packed, ids, mask, loss_mask), sums, rtol=0, atol=1e-4)


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_hidden_states_of_both_cpu_attentions(attention):
    model, packed = pair("llama", attention)
    ids, mask = rl_batch(RL_CASES["very different"], prompt=9, response=12)
    valid = mask.bool()
    expected = decoder_hidden_states(model, ids, mask)
    got = decoder_hidden_states(packed, ids, mask)
    torch.testing.assert_close(got[valid], expected[valid], rtol=0, atol=ATOL)
    assert not bool(got[~valid].any())


def test_a_batch_without_a_real_token_runs_the_padded_call():
    model, packed = pair("llama")
    ids, mask = right_batch([0, 0], width=5)
    assert pack(ids, mask) is None
    assert decoder_hidden_states(packed, ids, mask).shape == (2, 5, 32)


def test_pack_lays_sequences_end_to_end_with_restarting_positions():
    ids = torch.arange(1, 25).view(3, 8)
    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 0, 0], [1] * 8, [0, 0, 0, 0, 0, 0, 1, 1]])
    p = pack(ids, mask)
    assert p is not None and p.input_ids.shape == (2, 8)  # three rows in two
    assert p.input_ids.tolist() == [list(range(9, 17)), [3, 4, 5, 6, 23, 24, 0, 0]]
    # the unused tail is a sequence of its own: 0, 1, ... (nothing real attends it)
    assert p.position_ids.tolist() == [list(range(8)), [0, 1, 2, 3, 0, 1, 0, 1]]
    one = pack(ids, mask, one_row=True)
    assert one is not None and one.input_ids.shape == (1, 14)  # flash-attention's varlen layout


@pytest.mark.parametrize("lengths", [[5, 1, 4, 2, 3, 7, 6, 0], [9], [3, 3, 3, 3], [20, 1, 1, 1], []])
def test_first_fit_places_every_real_row_once_within_the_capacity(lengths):
    capacity = max(lengths, default=0)
    bins = first_fit(lengths, capacity)
    assert sorted(i for b in bins for i in b) == [i for i, n in enumerate(lengths) if n > 0]
    assert all(sum(lengths[i] for i in b) <= capacity for b in bins)
    assert len(bins) <= len([n for n in lengths if n > 0])


def test_an_architecture_without_a_document_mask_is_refused_naming_the_key():
    mamba = AutoModelForCausalLM.from_config(
        MambaConfig(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=1, state_size=4)
    )
    assert "position_ids" in (packing_refusal(mamba) or "")
    with pytest.raises(ConfigError, match=r"train\.packing is true.*Fix: --train\.packing false") as err:
        with_packing(True, mamba)
    assert err.value.key == "train.packing"
    assert not getattr(mamba, PACKING_ATTRIBUTE, False)
    with_packing(False, mamba)  # off: nothing checked, nothing marked


def test_copies_of_a_marked_model_keep_packing():
    model, packed = pair("llama")
    assert not getattr(model, PACKING_ATTRIBUTE, False)
    critic = ScalarHeadModel.from_causal_lm(copy.deepcopy(packed))
    assert getattr(critic.causal_lm, PACKING_ATTRIBUTE)


def test_the_cli_refuses_packing_for_such_an_architecture_before_loading_it(tmp_path, capsys):
    from rlhf.cli import main

    MambaConfig(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=1, state_size=4).save_pretrained(
        tmp_path / "m"
    )
    data = tmp_path / "sft.jsonl"
    data.write_text('{"prompt": "a", "response": "b"}\n')
    args = ["sft", "--model", str(tmp_path / "m"), "--data", str(data), "--out", str(tmp_path / "run")]
    assert main([*args, "--train.packing", "true"]) == 2  # config.json alone: no weights are there
    err = capsys.readouterr().err
    assert "train.packing is true, but MambaForCausalLM" in err and "Fix: --train.packing false" in err
