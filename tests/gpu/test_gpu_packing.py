"""Sequence packing on a CUDA GPU (`train.packing`, rlhf/models/packing.py): SDPA with the document
mask transformers builds from restarting position ids, and flash-attention's varlen path (every
sequence in one row, bounds from the position ids) where `flash_attn` is installed. Log-probs and
values equal the padded path's (float32 for SDPA; bf16 flash-attention against padded bf16 SDPA at
a bf16 tolerance). Skipped without CUDA, and the flash case without flash_attn, each saying why."""

from __future__ import annotations

import copy
import importlib.util

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from rlhf.models.logprobs import response_logprobs
from rlhf.models.packing import enable_packing, pack
from rlhf.models.scalar_head import ScalarHeadModel, response_values

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available() is False)"
    ),
]
CUDA = torch.device("cuda")
HAS_FLASH = importlib.util.find_spec("flash_attn") is not None


def model(attention: str, dtype: torch.dtype):
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
    )  # fmt: skip
    return (
        AutoModelForCausalLM.from_config(config, attn_implementation=attention, dtype=dtype).to(CUDA).eval()
    )


def batch():
    lengths = [(3, 4), (9, 12), (1, 1), (0, 0), (5, 2)]  # (prompt, response): a fully masked row
    ids = torch.randint(1, 64, (len(lengths), 21), generator=torch.Generator().manual_seed(0))
    mask = torch.zeros_like(ids)
    for r, (p, t) in enumerate(lengths):
        mask[r, 9 - p : 9 + t] = 1
    return ids.to(CUDA), mask.to(CUDA)


def test_sdpa_packed_equals_padded_in_float32():
    padded = model("sdpa", torch.float32)
    packed = copy.deepcopy(padded)
    enable_packing(packed)
    ids, mask = batch()
    valid = mask[:, 9:].bool()
    expected, _ = response_logprobs(padded, ids, mask, 9)
    got, _ = response_logprobs(packed, ids, mask, 9)
    torch.testing.assert_close(got[valid], expected[valid], rtol=0, atol=1e-5)
    critic, packed_critic = ScalarHeadModel.from_causal_lm(padded), ScalarHeadModel.from_causal_lm(packed)
    packed_critic.head.load_state_dict(critic.head.state_dict())
    torch.testing.assert_close(
        response_values(packed_critic, ids, mask, 9)[valid], response_values(critic, ids, mask, 9)[valid],
        rtol=0, atol=1e-5,
    )  # fmt: skip


@pytest.mark.skipif(not HAS_FLASH, reason="needs flash_attn (pip install flash-attn) for the varlen path")
def test_flash_attention_varlen_packs_one_row_and_matches_padded_sdpa():
    padded = model("sdpa", torch.bfloat16)
    packed = model("flash_attention_2", torch.bfloat16)
    packed.load_state_dict(padded.state_dict())
    enable_packing(packed)
    ids, mask = batch()
    assert pack(ids, mask, one_row=True).input_ids.shape[0] == 1
    valid = mask[:, 9:].bool()
    expected, _ = response_logprobs(padded, ids, mask, 9)
    got, _ = response_logprobs(packed, ids, mask, 9)
    torch.testing.assert_close(got[valid], expected[valid], rtol=0, atol=5e-2)
