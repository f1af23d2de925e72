"""GGUF checkpoints load as plain float32 weights, so a model trained from one saves as a normal
Hugging Face directory (`save_pretrained` refuses a model still marked "quantized with gguf")."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from rlhf.cli import main
from rlhf.config import SFTConfig, load_config
from rlhf.models.loading import load_causal_lm, load_tokenizer
from rlhf.stages.sft import run_sft
from tests.support.gguf_testing import gguf, write_tiny_llama_gguf

GGUF_NAME = "tiny.Q4_1.gguf"


@pytest.fixture(scope="module")
def gguf_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("gguf")
    stored = write_tiny_llama_gguf(directory / GGUF_NAME)
    return directory, stored


def sft_data(path) -> str:
    rows = [{"prompt": f"wo {i}", "response": f"w{i} w{i + 1}"} for i in range(8)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_gguf_weights_load_dequantized_with_no_quantizer_left(gguf_dir):
    directory, stored = gguf_dir
    model = load_causal_lm(directory, gguf_file=GGUF_NAME)
    assert getattr(model, "hf_quantizer", None) is None
    assert getattr(model.config, "quantization_config", None) is None
    assert not getattr(model, "is_quantized", False)
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    # the gguf package's own dequantization is the reference (these tensors are not permuted on load)
    for gguf_name, module in (
        ("token_embd.weight", model.model.embed_tokens),
        ("blk.0.ffn_down.weight", model.model.layers[0].mlp.down_proj),
        ("output.weight", model.lm_head),
    ):
        np.testing.assert_array_equal(module.weight.detach().numpy(), stored[gguf_name], err_msg=gguf_name)


def test_a_model_trained_from_gguf_saves_and_reloads_without_gguf(gguf_dir, tmp_path):
    directory, _ = gguf_dir
    model = load_causal_lm(directory, gguf_file=GGUF_NAME)
    tokenizer = load_tokenizer(directory, gguf_file=GGUF_NAME)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    config = load_config(
        SFTConfig,
        overrides={
            "out": str(tmp_path / "sft"),
            "data": {"path": sft_data(tmp_path / "sft.jsonl"), "test_fraction": 0.0},
            "train": {"max_steps": 1, "batch_size": 4, "micro_batch_size": 4},
            "optim": {"lr": 1e-2, "warmup_steps": 0},
            "sinks": ["jsonl"],
        },
    )
    run_sft(config, model=model, tokenizer=tokenizer, quiet=True)
    saved_config = json.loads((tmp_path / "sft" / "config.json").read_text())
    assert "quantization_config" not in saved_config
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "sft")
    trained = model.state_dict()
    assert set(reloaded.state_dict()) == set(trained)
    for name, weight in reloaded.state_dict().items():
        assert torch.equal(weight, trained[name]), name
    assert any(not torch.equal(trained[k], v) for k, v in before.items())  # the step changed weights


def test_rlhf_sft_from_a_gguf_file_writes_a_loadable_directory(gguf_dir, tmp_path):
    directory, _ = gguf_dir
    out = tmp_path / "sft"
    code = main(
        ["sft", "--model", str(directory), "--gguf_file", GGUF_NAME, "--data", sft_data(tmp_path / "d.jsonl"),
         "--out", str(out), "--train.max_steps", "1", "--train.batch_size", "4",
         "--data.test_fraction", "0", "--sinks", "jsonl"]
    )  # fmt: skip
    assert code == 0
    reloaded = AutoModelForCausalLM.from_pretrained(out)
    from_gguf = load_causal_lm(directory, gguf_file=GGUF_NAME)
    assert set(reloaded.state_dict()) == set(from_gguf.state_dict())
    assert gguf.GGUFReader(directory / GGUF_NAME).tensors  # the source file is left as it was


def test_a_gguf_chat_template_is_applied_and_its_end_of_turn_stops_responses(tmp_path):
    from rlhf.data import SFTExample, encode_sft
    from rlhf.data.chat import stop_token_ids

    chatml = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    write_tiny_llama_gguf(tmp_path / GGUF_NAME, chat_template=chatml)
    tokenizer = load_tokenizer(tmp_path, gguf_file=GGUF_NAME)
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    prompt, response = encode_sft(tokenizer, SFTExample("\n\nHuman: wo\n\nAssistant:", "wo"))
    assert tokenizer.decode(prompt) == "<|im_start|>user\nwo<|im_end|>\n<|im_start|>assistant\n"
    assert response[-1] == im_end and tokenizer.decode(response[:-1]) == "wo"
    assert stop_token_ids(tokenizer) == [tokenizer.eos_token_id, im_end]
    assert stop_token_ids(tokenizer, False) == [tokenizer.eos_token_id]
