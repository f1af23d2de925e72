"""A rank's side of tests/parallel/test_fsdp_whole_copy.py (tests.support.whole_copy_cases): LoRA
models sharded per layer, gathered whole by `fsdp.whole_copy` and exported (LoRA merged)."""

from __future__ import annotations

import torch


def lora_exports() -> dict:
    """For a LoRA causal LM and a LoRA reward model (tied embeddings, adapters not zero), sharded
    from rank 0 over the group: whether the export of the whole copy (rank 0's) equals the export of
    the model before sharding, the copy's class, and every rank's trained parameters' names."""
    from torch.distributed.fsdp import FSDPModule

    from rlhf.config import LoraConfig
    from rlhf.models.export import export_copy
    from rlhf.models.scalar_head import ScalarHeadModel
    from rlhf.models.tiny import tiny_causal_lm, word_tokenizer
    from rlhf.parallel.fsdp import shard_from_rank0, whole_copy
    from rlhf.parallel.peers import current_peers
    from rlhf.train.setup import with_lora
    from rlhf.train.supervised.model_call import ModelCall

    tok = word_tokenizer(["a b c d e f g"])
    out: dict = {}
    copies: dict = {}
    roots: dict = {}
    for kind in ("lm", "rm"):
        base = tiny_causal_lm(
            tok, seed=0, hidden_size=32, num_layers=2, num_heads=2, tie_word_embeddings=True
        )
        if kind == "rm":
            model = ScalarHeadModel.from_causal_lm(base, head_init_std=0.5)
            model.causal_lm = with_lora(model.causal_lm, LoraConfig(enabled=True, r=4))
        else:
            model = with_lora(base, LoraConfig(enabled=True, r=4))
        with torch.no_grad():  # adapters not zero: the merge changes the weights
            generator = torch.Generator().manual_seed(1)
            for name, param in model.named_parameters():
                if "lora_B" in name:
                    param.copy_(0.1 * torch.randn(param.shape, generator=generator))
        want = {k: v.clone() for k, v in export_copy(model).state_dict().items()}
        trained = sorted(n for n, p in model.named_parameters() if p.requires_grad)
        roots[kind] = shard_from_rank0(ModelCall(model), current_peers())  # kept: its meta copy with it
        with whole_copy(model, every_rank=True) as plain:
            assert plain is not None  # every rank's copy
            out[f"{kind}_trained"] = (
                sorted(n for n, p in plain.named_parameters() if p.requires_grad) == trained
            )
        with whole_copy(model) as plain:
            copies[kind] = (plain, want)  # compared after the last collective: no rank waits on it
    for kind, (plain, want) in copies.items():
        if plain is None:
            out[kind] = None
            continue
        got = export_copy(plain).state_dict()
        out[kind] = {
            "equal": sorted(got) == sorted(want) and all(torch.equal(got[k], want[k]) for k in want),
            "class": type(plain).__name__,
            "fsdp": any(isinstance(m, FSDPModule) for m in plain.modules()),
        }
    return out
