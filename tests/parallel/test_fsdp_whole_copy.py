"""`fsdp.whole_copy` (no torch internals where a public API does the job): a model sharded
per layer is gathered whole through torch's `get_model_state_dict` into a plain copy made on the
meta device before sharding; its LoRA-merged export equals the unsharded model's, on rank 0 only
(the others get None) unless every rank asks for its own."""

from __future__ import annotations

import pytest

from tests.support.ranks import run_ranks
from tests.support.whole_copy_cases import lora_exports


@pytest.mark.slow
def test_a_sharded_lora_model_exports_as_the_unsharded_one_through_a_plain_whole_copy():
    rank0, rank1 = run_ranks(lora_exports)
    for kind, model_class in (("lm", "PeftModelForCausalLM"), ("rm", "ScalarHeadModel")):
        assert rank0[kind] == {"equal": True, "class": model_class, "fsdp": False}, kind
        assert rank1[kind] is None, kind  # rank 0 alone holds the CPU copy
        assert rank0[f"{kind}_trained"] and rank1[f"{kind}_trained"], kind
