"""Micro-batches of similar-length rows leave every loss and result as it was: the gradient of an
SFT step, an RM step and a PPO minibatch equals a plain reference (each row alone, or the whole
batch in one forward) up to float summation order, and the rollout's forwards give each row its
own result in the rows' order."""

from __future__ import annotations

from dataclasses import fields, replace

import pytest
import torch

from rlhf.config import OptimConfig, RewardConfig, SFTConfig, load_config
from rlhf.models.scalar_head import ScalarHeadModel
from rlhf.models.sequences import Sequences
from rlhf.models.tiny import tiny_causal_lm
from rlhf.rl.experience import Experience, in_row_chunks
from rlhf.stages import rm as rm_module
from rlhf.stages import sft as sft_module
from rlhf.stages.rm import EncodedPair, evaluate_pairs, pair_forward, pair_step, ranking_loss
from rlhf.stages.sft import EncodedSFT, evaluate_nll, sft_step
from rlhf.train.learner import Learner, Training
from rlhf.train.lm_loss import model_token_nll
from rlhf.train.micro_batches import MicroBatching
from tests.support.train_testing import rl_config

ATOL = 1e-6


def grads_of(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The gradients of `module` (zeros where none), then cleared."""
    out = {
        n: (q.grad.clone() if q.grad is not None else torch.zeros_like(q))
        for n, q in module.named_parameters()
        if q.requires_grad
    }
    module.zero_grad(set_to_none=True)
    return out


def assert_same_grads(got: dict, expected: dict) -> None:
    assert got.keys() == expected.keys()
    assert any(bool(g.abs().sum() > 0) for g in expected.values())  # a gradient that says something
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=1e-5, atol=ATOL, msg=name)


def unstepped(model: torch.nn.Module, micro_batch_size: int, by_length: bool) -> Learner:
    """A learner of `model` whose optimizer step leaves the gradients for the test to read."""
    learner = Learner.build(model, Training(OptimConfig(), 1, MicroBatching(micro_batch_size, by_length)))
    learner.optimizer_step = lambda: 0.0
    return learner


def random_ids(generator: torch.Generator, n: int, vocab: int) -> list[int]:
    return torch.randint(3, vocab, (n,), generator=generator).tolist()


# -- SFT ---------------------------------------------------------------------------------------
@pytest.fixture()
def lm(tok):
    return tiny_causal_lm(tok, seed=0, hidden_size=32, num_layers=1, num_heads=2)


def sft_rows(tok, lengths: list[tuple[int, int]]) -> list[EncodedSFT]:
    generator = torch.Generator().manual_seed(0)
    vocab = len(tok)
    return [EncodedSFT(random_ids(generator, p, vocab), random_ids(generator, r, vocab)) for p, r in lengths]


# (prompt, response) lengths: mixed; one-token responses (a single scored token each) beside long
# ones; a batch of one
SFT_CASES = {
    "mixed": [(2, 3), (9, 1), (1, 7), (5, 5), (3, 2), (8, 6), (2, 2)],
    "one_token_responses": [(1, 1), (6, 3), (1, 1), (3, 9), (7, 1)],
    "one_row": [(4, 6)],
}


@pytest.mark.parametrize("case", SFT_CASES)
def test_sft_step_gradient_is_the_token_mean_however_rows_are_grouped(case, tok, lm):
    rows = sft_rows(tok, SFT_CASES[case])
    pad = tok.pad_token_id
    # the reference: each row alone (no padding at all), NLL summed, divided by the scored tokens
    nll_sum, count = 0.0, 0
    for row in rows:
        ids = torch.tensor([row.prompt_ids + row.response_ids])
        loss_mask = torch.tensor([[0.0] * len(row.prompt_ids) + [1.0] * len(row.response_ids)])
        nll, n = model_token_nll(lm, ids, torch.ones_like(ids), loss_mask)
        nll_sum, count = nll_sum + nll, count + n
    (nll_sum / max(count, 1)).backward()
    expected = grads_of(lm)
    for by_length in (False, True):
        loss_sum, tokens, _ = sft_step(unstepped(lm, 2, by_length), rows, pad)
        assert tokens == count
        assert loss_sum == pytest.approx(float(nll_sum.detach()), rel=1e-5)
        assert_same_grads(grads_of(lm), expected)


def test_sft_evaluation_by_length_gives_the_same_loss(tok, lm):
    rows = sft_rows(tok, SFT_CASES["mixed"] + SFT_CASES["one_token_responses"])
    plain = evaluate_nll(unstepped(lm, 3, by_length=False), rows, tok.pad_token_id)
    grouped = evaluate_nll(unstepped(lm, 3, by_length=True), rows, tok.pad_token_id)
    assert grouped["tokens"] == plain["tokens"]
    assert grouped["loss"] == pytest.approx(plain["loss"], rel=1e-6)


# -- reward model ------------------------------------------------------------------------------
@pytest.fixture()
def reward_model(tok):
    lm = tiny_causal_lm(tok, seed=2, hidden_size=32, num_layers=1, num_heads=2)
    return ScalarHeadModel.from_causal_lm(lm, head_init_std=0.5)


def pair_rows(tok, lengths: list[tuple[int, int, int]]) -> list[EncodedPair]:
    generator = torch.Generator().manual_seed(1)
    vocab, eos = len(tok), tok.eos_token_id
    return [
        EncodedPair(
            random_ids(generator, p, vocab),
            random_ids(generator, c - 1, vocab) + [eos],
            random_ids(generator, r - 1, vocab) + [eos],
        )
        for p, c, r in lengths
    ]


PAIR_CASES = {
    "mixed": [(2, 3, 6), (7, 1, 1), (1, 8, 2), (4, 4, 4), (3, 2, 9)],
    "one_pair": [(3, 5, 2)],
}


@pytest.mark.parametrize("case", PAIR_CASES)
def test_rm_step_gradient_is_the_pair_and_token_mean_however_pairs_are_grouped(case, tok, reward_model):
    rows = pair_rows(tok, PAIR_CASES[case])
    pad, lm_coef = tok.pad_token_id, 0.5
    # the reference: each pair alone, ranking loss summed / pairs + lm_coef x chosen NLL / tokens
    rank_sum, nll_sum, count = 0.0, 0.0, 0
    for row in rows:
        chosen, rejected, nll, n = pair_forward(reward_model, [row], pad, with_lm=True)
        rank_sum, nll_sum, count = rank_sum + ranking_loss(chosen, rejected), nll_sum + nll, count + n
    (rank_sum / len(rows) + lm_coef * nll_sum / count).backward()
    expected = grads_of(reward_model)
    for by_length in (False, True):
        metrics = pair_step(unstepped(reward_model, 2, by_length), rows, pad, lm_coef)
        assert metrics["train/rank_loss"] == pytest.approx(float(rank_sum.detach()) / len(rows), rel=1e-5)
        assert_same_grads(grads_of(reward_model), expected)


def test_rm_evaluation_by_length_keeps_each_margin_in_its_row(tok, reward_model):
    rows = pair_rows(tok, PAIR_CASES["mixed"] * 2)
    with torch.no_grad():
        alone = [float(c - r) for c, r, _, _ in (pair_forward(reward_model, [row], 0, False) for row in rows)]
    grouped = evaluate_pairs(reward_model, rows, tok.pad_token_id, 3, with_lm=True, by_length=True)
    plain = evaluate_pairs(reward_model, rows, tok.pad_token_id, 3, with_lm=True, by_length=False)
    assert grouped["margins"] == pytest.approx(alone, abs=1e-4)  # rounded to 4 decimals
    assert grouped["accuracy"] == plain["accuracy"]
    assert grouped["lm_ppl"] == pytest.approx(plain["lm_ppl"], rel=1e-6)


# -- PPO ---------------------------------------------------------------------------------------
def rollout_experience(trainer) -> Experience:
    """A real rollout (left-padded prompts of 2-4 words, responses of 1-5 tokens) with one
    response dropped (a fully masked row)."""
    made, _ = trainer.make_experience()
    experience = Experience(
        prompt_length=made.prompt_length,
        **{f.name: getattr(made, f.name).clone() for f in fields(made) if f.name != "prompt_length"},
    )  # out of inference mode, so that a row can be dropped below
    experience.response_mask[2] = 0.0
    for name in ("advantages", "returns", "old_logp", "ref_logp", "old_values"):
        getattr(experience, name)[2] = 0.0
    lengths = experience.response_mask.sum(1)
    assert lengths.min() == 0 and lengths.max() > lengths[lengths > 0].min()  # mixed, padded
    assert experience.attention_mask[:, 0].min() == 0  # left padding in the prompt block
    return experience


def step_grads(role, minibatch: Experience) -> dict[str, torch.Tensor]:
    """The gradient of `role.train_step(minibatch)`, without the optimizer step."""
    taken = {}

    def record() -> float:
        taken.update(grads_of(role.learner.module))
        return 0.0

    role.learner.optimizer_step = record
    role.train_step(minibatch, minibatch.num_tokens)
    del role.learner.optimizer_step
    return taken


@pytest.mark.parametrize("rows", ["all", "one"])
def test_ppo_minibatch_gradient_is_the_same_with_sorted_micro_batches(rows, make_trainer):
    trainer = make_trainer(rl_config("ppo_max", train={"micro_batch_size": 3}))
    experience = rollout_experience(trainer)
    minibatch = experience.select(torch.arange(8) if rows == "all" else torch.tensor([4]))
    for role in trainer.runtime.roles.learners():
        batching = role.learner.batching
        role.learner.batching = replace(batching, micro_batch_size=8)  # the whole minibatch in one forward
        expected = step_grads(role, minibatch)
        for by_length in (False, True):
            role.learner.batching = replace(batching, micro_batch_size=3, by_length=by_length)
            assert_same_grads(step_grads(role, minibatch), expected)


def test_sorted_micro_batches_cover_every_row_once_with_rows_of_similar_length(make_trainer):
    trainer = make_trainer(rl_config("ppo_max"))
    experience = rollout_experience(trainer)
    micros = list(experience.micro_batches(3, by_length=True))
    assert sum(m.batch_size for m in micros) == experience.batch_size
    assert sum(m.num_tokens for m in micros) == experience.num_tokens
    cost = sum(m.input_ids.numel() for m in micros)
    assert cost <= sum(m.input_ids.numel() for m in experience.micro_batches(3))
    lengths = [m.response_mask.sum(1) + m.attention_mask[:, : m.prompt_length].sum(1) for m in micros]
    assert all(float(a.min()) >= float(b.max()) for a, b in zip(lengths, lengths[1:]))  # longest first


@pytest.mark.parametrize("role", ["policy", "reference", "critic", "reward_model"])
def test_rollout_forwards_by_length_give_each_row_its_own_result(role, make_trainer):
    trainer = make_trainer(rl_config("ppo_max", train={"micro_batch_size": 3}))
    r = trainer.runtime.roles
    experience = rollout_experience(trainer)
    sequences = experience.sequences

    def forward(s: Sequences) -> torch.Tensor:
        if role == "policy":
            return r.policy.logprobs(s)
        if role == "critic":
            return r.critic.values(s)
        if role == "reward_model":
            return r.reward_model.score(s)
        with r.reference.session() as logprobs:
            return logprobs(s)

    with torch.no_grad():
        alone = [forward(sequences.rows(slice(i, i + 1))) for i in range(8)]  # each row trimmed alone
        for by_length in (False, True):
            for holder in (r.policy, r.critic, r.reference, r.reward_model):
                holder.by_length = by_length
            out = forward(sequences)
            if role == "reward_model":
                torch.testing.assert_close(out, torch.cat(alone), rtol=0, atol=1e-5)
                continue
            valid = sequences.attention_mask[:, sequences.prompt_length :].bool()
            for i in range(8):
                width = alone[i].shape[1]  # the row's own response length
                assert valid[i, width:].sum() == 0 and not out[i, width:].any()  # 0 at padding
                torch.testing.assert_close(out[i, :width], alone[i][0], rtol=0, atol=1e-5)


def test_in_row_chunks_by_length_restores_the_row_order():
    """A forward that returns each row's own ids: the result must come back row for row."""
    ids = torch.tensor([[0, 5, 6, 7, 0, 0], [4, 4, 4, 9, 9, 9], [0, 0, 3, 1, 0, 0], [0, 8, 8, 2, 2, 0]])
    attn = (ids > 0).long()
    calls = []

    def fn(s: Sequences) -> torch.Tensor:
        calls.append(s.input_ids.shape)
        return s.input_ids[:, s.prompt_length :].float()

    out = in_row_chunks(fn, Sequences(ids, attn, 3), rows=2, by_length=True)
    torch.testing.assert_close(out, ids[:, 3:].float())
    assert sorted(calls) == [(2, 3), (2, 6)]  # rows 1 and 3 together; 0 and 2 trimmed to 3 columns


def test_sort_by_length_switch_reaches_every_role(make_trainer):
    for value in (True, False):
        trainer = make_trainer(rl_config("ppo_max", runtime={"sort_by_length": value}))
        r = trainer.runtime.roles
        # the learners' own cutting, the frozen roles' Scoring
        holders = (
            r.policy.learner.batching,
            r.critic.learner.batching,
            r.reference.scoring,
            r.reward_model.scoring,
        )
        assert all(h.by_length is value for h in holders)


@pytest.mark.parametrize("stage", ["sft", "rm"])
def test_across_steps_uses_every_row_once_per_epoch_in_steps_of_similar_length(
    stage, tok, lm, monkeypatch, tmp_path
):
    """HF-style grouping: 2 epochs of 20 rows in steps of 4 (SFT's 20 % 4 = 0 and RM's plan per
    epoch): each row twice, and each step's rows closer in length than random steps' rows."""
    generator = torch.Generator().manual_seed(3)
    sizes = torch.randint(1, 12, (20, 3), generator=generator).tolist()
    seen: list[list] = []
    overrides = {
        "out": str(tmp_path / "run"),
        "train": {"epochs": 2, "batch_size": 4, "micro_batch_size": 2, "group_by_length": "across_steps"},
        "optim": {"warmup_steps": 0},
        "sinks": ["jsonl"],
    }
    if stage == "sft":
        rows = sft_rows(tok, [(p, r) for p, r, _ in sizes])
        real = sft_module.sft_step
        monkeypatch.setattr(sft_module, "sft_step", lambda m, r, *a: seen.append(r) or real(m, r, *a))
        sft_module.run_sft(
            load_config(SFTConfig, overrides=overrides),
            model=lm,
            tokenizer=tok,
            train_rows=rows,
            test_rows=[],
            quiet=True,
        )
        length = {id(r): len(r.prompt_ids) + len(r.response_ids) for r in rows}
    else:
        rows = pair_rows(tok, sizes)
        real = rm_module.pair_step
        monkeypatch.setattr(rm_module, "pair_step", lambda m, r, *a: seen.append(r) or real(m, r, *a))
        model = ScalarHeadModel.from_causal_lm(lm, head_init_std=0.5)
        config = load_config(
            RewardConfig, overrides={**overrides, "train": {**overrides["train"], "eval_every": 0}}
        )
        rm_module.run_reward_training(
            config, model=model, tokenizer=tok, train_rows=rows, test_rows=[], quiet=True
        )
        length = {id(r): len(r.prompt_ids) + max(len(r.chosen_ids), len(r.rejected_ids)) for r in rows}
    assert len(seen) == 10 and all(len(step) == 4 for step in seen)
    counts = {}
    for step in seen:
        for row in step:
            counts[id(row)] = counts.get(id(row), 0) + 1
    assert sorted(counts.values()) == [2] * 20 and set(counts) == set(length)
    spread = sum(max(length[id(r)] for r in s) - min(length[id(r)] for r in s) for s in seen)
    shuffled = torch.randperm(20, generator=generator).tolist() * 2
    random_spread = sum(
        max(length[id(rows[i])] for i in shuffled[k : k + 4])
        - min(length[id(rows[i])] for i in shuffled[k : k + 4])
        for k in range(0, 40, 4)
    )
    assert spread < random_spread
