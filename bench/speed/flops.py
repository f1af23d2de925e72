"""FLOP counts of one PPO iteration, phase by phase (model FLOPs of the tensors actually computed).

Conventions (the usual "model FLOPs", as in PaLM's MFU):
- a matmul of [m, k] by [k, n] is 2mkn FLOPs; element-wise work, softmax, norms and the
  embedding lookup are not counted;
- a forward pass over `rows x seq` tokens costs 2 * (decoder matmul parameters) per token, plus
  attention 4 * layers * hidden * seq per token (scores QK^T and the weighted sum AV over the whole
  [seq, seq] block: a masked SDPA on CPU computes all of it), plus the output head on the columns
  where it runs (2 * hidden * vocab per column);
- a trained pass is 3x its forward (forward, gradient of the inputs, gradient of the weights);
  a LoRA-frozen base is counted 2x (no weight gradient; the adapters themselves are negligible;
  the first layer's input gradient is skipped by autograd, so this overcounts by 1/(2 layers));
- padding is counted: the hardware computes it, so this is the rate the machine achieved;
- recomputation (activation checkpointing of the logits chunks) is not counted.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelShape:
    """The matmul shapes of a Llama-style decoder."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int

    @classmethod
    def from_config(cls, config) -> ModelShape:
        heads = int(config.num_attention_heads)
        return cls(
            hidden=int(config.hidden_size),
            layers=int(config.num_hidden_layers),
            heads=heads,
            kv_heads=int(getattr(config, "num_key_value_heads", None) or heads),
            intermediate=int(config.intermediate_size),
            vocab=int(config.vocab_size),
        )

    @property
    def decoder_matmul_params(self) -> int:
        """Weights that take part in matmuls, per token, in the decoder (q, k, v, o, gate, up, down)."""
        kv_dim = self.hidden // self.heads * self.kv_heads
        per_layer = (
            2 * self.hidden * self.hidden + 2 * self.hidden * kv_dim + 3 * self.hidden * self.intermediate
        )
        return self.layers * per_layer

    @property
    def head_params(self) -> int:
        return self.hidden * self.vocab


def decoder_forward(shape: ModelShape, rows: int, seq: int) -> float:
    """Decoder forward over `rows` sequences of `seq` tokens, no KV cache."""
    tokens = rows * seq
    return 2.0 * shape.decoder_matmul_params * tokens + 4.0 * shape.layers * shape.hidden * seq * tokens


def head_forward(shape: ModelShape, columns: int) -> float:
    """The vocabulary head on `columns` hidden states (rows x columns where it runs)."""
    return 2.0 * shape.head_params * columns


def generation(shape: ModelShape, rows: int, prompt: int, new_tokens: int) -> float:
    """KV-cache sampling of `new_tokens` per row after a `prompt`-column prefill.

    The prefill is a decoder forward over the prompt block with the head on its last column; step
    i = 1 .. new_tokens - 1 feeds one token per row against a cache of prompt + i columns and runs
    the head on it (the last token sampled needs no forward).
    """
    flops = decoder_forward(shape, rows, prompt) + head_forward(shape, rows)
    for i in range(1, new_tokens):
        context = prompt + i
        flops += 2.0 * shape.decoder_matmul_params * rows + 4.0 * shape.layers * shape.hidden * context * rows
        flops += head_forward(shape, rows)
    return flops


@dataclass(frozen=True)
class IterationShape:
    """What one iteration of our trainer computes: rollout rows, prompt and response widths,
    update passes, and which models' decoders are LoRA-frozen in training."""

    rows: int  # B
    prompt: int  # P, the left-padded prompt block
    response: int  # T, the response block
    ppo_epochs: int = 1
    lora_policy: bool = False  # the policy's base weights are frozen (LoRA): 2x forward in training
    old_logp_forward: bool = (
        True  # False: old log-probs come from the sampler (rollout.logprobs_from_sampler)
    )


def iteration_phases(policy: ModelShape, critic: ModelShape, reward: ModelShape, it: IterationShape) -> dict:
    """FLOPs per phase of our trainer (rlhf.rl.trainer.RLTrainer.step):

    - generate: sampling with the policy (KV cache);
    - score: the reward model over prompt + response (its scalar head is negligible);
    - forward: no-grad old log-probs (policy; skipped with rollout.logprobs_from_sampler),
      reference log-probs (reference = policy shape), values (critic); these decoders run on all
      but the last column and log-prob heads on the T response columns only;
    - update: `ppo_epochs` passes over every row (the minibatches partition the batch): policy
      trained (decoder + head on T columns) and critic trained (decoder).
    """
    seq = it.prompt + it.response
    head_cols = it.rows * it.response
    # log-probs and values never need the last column's hidden state: those decoders see seq - 1
    policy_fwd = decoder_forward(policy, it.rows, seq - 1) + head_forward(policy, head_cols)
    # the critic's scalar head (hidden -> 1) runs on the T response columns, the reward model's on all
    critic_fwd = decoder_forward(critic, it.rows, seq - 1) + 2.0 * critic.hidden * head_cols
    reward_fwd = decoder_forward(reward, it.rows, seq) + 2.0 * reward.hidden * it.rows * seq
    policy_train = (2.0 if it.lora_policy else 3.0) * policy_fwd
    return {
        "generate": generation(policy, it.rows, it.prompt, it.response),
        "score": reward_fwd,
        "forward": (2 if it.old_logp_forward else 1) * policy_fwd + critic_fwd,
        "update": it.ppo_epochs * (policy_train + 3.0 * critic_fwd),
    }
