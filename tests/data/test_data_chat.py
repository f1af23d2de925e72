"""Chat templates: HH dialogues and messages rendered with the tokenizer's template,
responses closed by its end-of-turn token, the switch off = verbatim text, truncation that keeps
the template whole, and generation that stops at the end-of-turn token."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from rlhf.config import ConfigError, RewardConfig, RLConfig, SFTConfig, load_config
from rlhf.data import PreferenceExample, SFTExample, TruncationStats, encode_pair, encode_prompt, encode_sft
from rlhf.data.chat import end_of_turn_id, hh_messages, stop_token_ids
from rlhf.data.tokenize import render_prompt
from rlhf.evaluation.judging import sample_responses
from rlhf.models.tiny import tiny_causal_lm, word_tokenizer

WORDS = "Human: Assistant: user assistant system w1 w2 w3 w4 w5 w6 w7 w8 S r1 r2 user: assistant: system:"
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
HH = "\n\nHuman: w1 w2\n\nAssistant: w3\n\nHuman: w4 w5 w6\n\nAssistant: w7\n\nHuman: w8\n\nAssistant:"


def chat_tokenizer(template: str = CHATML):
    tokenizer = word_tokenizer([WORDS])
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tokenizer.chat_template = template
    return tokenizer


@pytest.fixture(scope="module")
def tok():
    return chat_tokenizer()


@pytest.fixture(scope="module")
def plain_tok():
    return word_tokenizer([WORDS])  # the same words, no chat template (today's tokenizers)


def ids(tokenizer, tokens: str) -> list[int]:
    return [tokenizer.convert_tokens_to_ids(t) for t in tokens.split()]


def turn(role: str, words: str) -> str:
    return f"<|im_start|> {role} {words} <|im_end|>"


GENERATION_PROMPT = "<|im_start|> assistant"


# --- rendering ------------------------------------------------------------------------------------


def test_hh_dialogue_becomes_messages():
    assert hh_messages(HH) == [
        {"role": "user", "content": "w1 w2"},
        {"role": "assistant", "content": "w3"},
        {"role": "user", "content": "w4 w5 w6"},
        {"role": "assistant", "content": "w7"},
        {"role": "user", "content": "w8"},
    ]  # the empty last "Assistant:" is the generation cue, not a message
    assert hh_messages("S\n\nHuman: w1\n\nAssistant:") == [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "w1"},
    ]
    assert hh_messages("w1 w2") is None  # no HH turn: a plain string


def test_hh_dialogue_is_rendered_with_the_template(tok):
    expected = (
        "<|im_start|>user\nw1 w2<|im_end|>\n<|im_start|>assistant\nw3<|im_end|>\n"
        "<|im_start|>user\nw4 w5 w6<|im_end|>\n<|im_start|>assistant\nw7<|im_end|>\n"
        "<|im_start|>user\nw8<|im_end|>\n<|im_start|>assistant\n"
    )
    assert render_prompt(tok, HH) == expected
    assert encode_prompt(tok, HH) == ids(
        tok,
        " ".join([turn("user", "w1 w2"), turn("assistant", "w3"), turn("user", "w4 w5 w6")])
        + " "
        + " ".join([turn("assistant", "w7"), turn("user", "w8"), GENERATION_PROMPT]),
    )


def test_messages_are_rendered_with_the_template(tok):
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "w1"}]
    assert encode_prompt(tok, messages) == ids(
        tok, f"{turn('system', 'S')} {turn('user', 'w1')} {GENERATION_PROMPT}"
    )


def test_a_plain_string_prompt_stays_verbatim(tok):
    assert encode_prompt(tok, "w1 w2") == ids(tok, "w1 w2")
    assert encode_sft(tok, SFTExample("w1 w2", "r1"))[1] == ids(tok, "r1 <eos>")


def test_responses_to_templated_prompts_end_with_the_end_of_turn_token(tok):
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    assert end_of_turn_id(tok) == im_end != tok.eos_token_id
    prompt, response = encode_sft(tok, SFTExample(HH, "r1 r2"))
    assert response == ids(tok, "r1 r2 <|im_end|>")
    assert prompt[-2:] == ids(tok, GENERATION_PROMPT)
    messages = [{"role": "user", "content": "w1"}]
    _, chosen, rejected = encode_pair(tok, PreferenceExample(messages, "r1", "r2"))
    assert (chosen, rejected) == (ids(tok, "r1 <|im_end|>"), ids(tok, "r2 <|im_end|>"))
    # a cut response still ends with the end-of-turn token, and one already ending with it gets no second
    stats = TruncationStats()
    assert encode_sft(tok, SFTExample(HH, "r1 r2 r1"), max_response_tokens=2, stats=stats)[1] == ids(
        tok, "r1 <|im_end|>"
    )
    assert stats.responses_truncated == 1
    assert encode_sft(tok, SFTExample(HH, "r1 <|im_end|>"))[1] == ids(tok, "r1 <|im_end|>")


def test_a_template_without_end_of_turn_token_keeps_eos():
    tokenizer = chat_tokenizer("{% for m in messages %}{{ m.role }}: {{ m.content }} {% endfor %}assistant:")
    assert end_of_turn_id(tokenizer) is None
    assert encode_sft(tokenizer, SFTExample(HH, "r1"))[1] == ids(tokenizer, "r1 <eos>")
    assert stop_token_ids(tokenizer) == [tokenizer.eos_token_id]


def test_switch_off_is_the_verbatim_behaviour(tok, plain_tok):
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "w1"}]
    for prompt in (HH, messages, "w1 w2"):
        off = encode_sft(tok, SFTExample(prompt, "r1"), 8, 4, chat_template=False)
        plain = encode_sft(plain_tok, SFTExample(prompt, "r1"), 8, 4)  # a tokenizer without any template
        assert [tok.convert_ids_to_tokens(x) for x in off] == [
            plain_tok.convert_ids_to_tokens(x) for x in plain
        ]
    assert render_prompt(tok, HH, chat_template=False) == HH
    assert render_prompt(tok, messages, chat_template=False) == "system: S\n\nuser: w1\n\nassistant:"
    assert stop_token_ids(tok, False) == [tok.eos_token_id]
    # "auto" on a tokenizer without a template is the same as off
    assert encode_prompt(plain_tok, HH, chat_template="auto") == encode_prompt(
        plain_tok, HH, chat_template=False
    )


def test_true_without_a_template_and_bad_values_are_explained(plain_tok, tok):
    with pytest.raises(ValueError, match="has no chat template. Fix: --data.chat_template auto"):
        encode_prompt(plain_tok, HH, chat_template=True)
    with pytest.raises(ValueError, match="must be 'auto', true or false.*Fix:"):
        encode_prompt(tok, HH, chat_template="yes")


# --- truncation -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "budget,kept,turns_dropped",
    [
        (25, "user w1 w2|assistant w3|user w4 w5 w6|assistant w7|user w8", 0),  # fits: 25 tokens
        (24, "user w4 w5 w6|assistant w7|user w8", 2),  # the oldest exchange goes first: 16 tokens
        (16, "user w4 w5 w6|assistant w7|user w8", 2),
        (15, "user w8", 4),  # then the next (6 tokens); the last user turn is never dropped
        (6, "user w8", 4),
    ],
)
def test_truncation_drops_oldest_turns_and_keeps_the_template_whole(tok, budget, kept, turns_dropped):
    stats = TruncationStats()
    expected = " ".join(turn(*t.split(" ", 1)) for t in kept.split("|")) + " " + GENERATION_PROMPT
    assert encode_prompt(tok, HH, budget, stats) == ids(tok, expected)
    assert stats == TruncationStats(
        prompts=1,
        prompts_turns_dropped=int(turns_dropped > 0),
        turns_dropped=turns_dropped,
        prompts_truncated=int(turns_dropped > 0),
    )


def test_truncation_cuts_the_oldest_kept_text_not_the_template(tok):
    stats = TruncationStats()
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "w1 w2 w3 w4"}]
    got = encode_prompt(tok, messages, 11, stats)  # 13 tokens rendered; two words of the user text go
    assert got == ids(tok, f"{turn('system', 'S')} {turn('user', 'w3 w4')} {GENERATION_PROMPT}")
    assert stats.prompts_left_truncated == 1
    # when the template alone is over budget, tokens are cut from the left as for any prompt
    assert len(encode_prompt(tok, messages, 3)) == 3


# --- generation -----------------------------------------------------------------------------------


def always(tokenizer, token: str) -> nn.Module:
    """A tiny LM whose next-token argmax is always `token` (zero final norm, head bias only)."""
    lm = tiny_causal_lm(tokenizer, seed=0, hidden_size=16, num_layers=1, num_heads=2)
    lm.model.norm.weight.data.zero_()
    logits = torch.zeros(len(tokenizer))
    logits[tokenizer.convert_tokens_to_ids(token)] = 10.0
    head = nn.Linear(16, len(tokenizer), bias=True)
    head.weight.data.zero_()
    head.bias.data.copy_(logits)
    lm.lm_head = head
    return lm


def test_generation_stops_at_the_end_of_turn_token(tok):
    from rlhf.models.sampling import SamplingConfig

    lm = always(tok, "<|im_end|>")
    prompts = [encode_prompt(tok, HH), encode_prompt(tok, [{"role": "user", "content": "w1"}])]
    greedy = SamplingConfig(max_new_tokens=5, do_sample=False)
    rollouts, texts = sample_responses(lm, tok, prompts, greedy, seed=0, stop_ids=stop_token_ids(tok))
    rollout = rollouts[0]
    assert rollout.response_mask.sum(-1).tolist() == [1, 1]
    assert rollout.ended_with_eos.tolist() == [True, True] and texts == ["", ""]
    # with EOS alone (the template's token ignored), nothing stops the responses
    rollouts, _ = sample_responses(lm, tok, prompts, greedy, seed=0)
    assert rollouts[0].response_mask.sum(-1).tolist() == [5, 5]
    assert not rollouts[0].ended_with_eos.any()


# --- configuration --------------------------------------------------------------------------------


@pytest.mark.parametrize("cls", [SFTConfig, RewardConfig, RLConfig])
def test_config_takes_auto_true_false(cls):
    assert load_config(cls).data.chat_template == "auto"
    for value in (True, False, "auto"):
        got = load_config(cls, overrides={"data": {"chat_template": value}}).data.chat_template
        assert got == value and type(got) is type(value)
    with pytest.raises(ConfigError, match="data.chat_template must be one of 'auto', true, false"):
        load_config(cls, overrides={"data": {"chat_template": "maybe"}})


@pytest.mark.parametrize("setting", ["auto", False])
def test_the_rl_policy_stops_at_the_end_of_turn_token(tok, setting):
    """`rlhf train`'s policy role samples until EOS or, with the template on, its end-of-turn token."""
    from rlhf.models.scalar_head import ScalarHeadModel
    from rlhf.rl.roles.assemble import assemble_roles

    config = load_config(
        RLConfig,
        overrides={
            "data": {"chat_template": setting},
            "rollout": {"max_new_tokens": 4},
            "critic": {"pretrain_iterations": 0},
        },
    )
    policy = always(tok, "<|im_end|>")
    reward = ScalarHeadModel.from_causal_lm(
        tiny_causal_lm(tok, seed=1, hidden_size=16, num_layers=1, num_heads=2)
    )
    roles = assemble_roles(config, tokenizer=tok, policy=policy, reward_model=reward)
    assert roles.policy.stop_ids == stop_token_ids(tok, setting)
    rollout = roles.policy.generate([ids(tok, "w1 w2")], return_logprobs=False)
    length = int(rollout.response_mask.sum())
    assert length == (1 if setting == "auto" else 4)  # ends at <|im_end|> only with the template on


# --- the template's default system prompt (data.system_prompt) ------------------------------------

SMOLLM2_LIKE = (  # writes its own system prompt when the messages hold none, as SmolLM2's template
    "{% for m in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "<|im_start|>system\nS w1 w2<|im_end|>\n{% endif %}"
    "<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_default_system_prompt_is_dropped_only_when_the_data_has_none():
    from rlhf.data.chat import default_system_block

    tok = chat_tokenizer(SMOLLM2_LIKE)
    assert default_system_block(tok) == "<|im_start|>system\nS w1 w2<|im_end|>\n"
    hh = "\n\nHuman: w4\n\nAssistant:"
    with_default = render_prompt(tok, hh)
    assert with_default.startswith("<|im_start|>system\nS w1 w2<|im_end|>\n<|im_start|>user\nw4")
    assert (
        render_prompt(tok, hh, system_prompt="none")
        == "<|im_start|>user\nw4<|im_end|>\n<|im_start|>assistant\n"
    )
    own = [{"role": "system", "content": "w8"}, {"role": "user", "content": "w4"}]  # the data's: kept
    assert (
        render_prompt(tok, own, system_prompt="none")
        == render_prompt(tok, own)
        == ("<|im_start|>system\nw8<|im_end|>\n<|im_start|>user\nw4<|im_end|>\n<|im_start|>assistant\n")
    )
    # a template without a default system prompt renders the same either way
    plain = chat_tokenizer()
    assert default_system_block(plain) == ""
    assert render_prompt(plain, hh, system_prompt="none") == render_prompt(plain, hh)
    with pytest.raises(ValueError, match="data.system_prompt must be one of"):
        render_prompt(tok, hh, system_prompt="off")


def test_dropping_the_default_system_prompt_frees_its_tokens_for_the_dialogue():
    tok = chat_tokenizer(SMOLLM2_LIKE)
    kept = {}
    for setting in ("template", "none"):
        stats = TruncationStats()
        ids_ = encode_prompt(tok, HH, 16, stats, system_prompt=setting)
        kept[setting] = (tok.decode(ids_), stats.prompts_truncated, stats.turns_dropped)
    # 16 tokens: the default system block (6 tokens) leaves room for the last user turn only
    assert kept["template"] == (f"{turn('system', 'S w1 w2')} {turn('user', 'w8')} {GENERATION_PROMPT}", 1, 4)
    assert kept["none"] == (
        f"{turn('user', 'w4 w5 w6')} {turn('assistant', 'w7')} {turn('user', 'w8')} {GENERATION_PROMPT}",
        1,
        2,
    )


def test_system_prompt_setting_is_a_data_key_of_every_stage():
    for config_class, key in ((SFTConfig, "data"), (RewardConfig, "data"), (RLConfig, "data")):
        assert getattr(load_config(config_class, overrides={}), key).system_prompt == "template"
    with pytest.raises(ConfigError, match="system_prompt"):
        load_config(SFTConfig, overrides={"data": {"system_prompt": "off"}})
