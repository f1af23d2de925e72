"""Runtimes place the roles (rlhf/rl/roles/) and schedule their work; the RL loop is the same
for all of them.

    local        one process, CPU or one GPU (threads that overlap critic and policy live here)
    distributed  torchrun: every rank holds every role and a share of the rows; gradients summed
    ray          role groups on Ray actors across machines (rlhf/ray_runtime/, above rl: it builds roles)

The loop holds a `Runtime` (protocol.py; mypy checks every runtime against it) and calls its roles
by name, on plain data (no callables or generators cross):

    generate(prompts, return_logprobs)   the policy's rollout (its own random state draws)
    submit_generate(...), policy_version a rollout started now, its handle's `result()` waited for later
                                         (asynchronous rollouts: Ray's rollout group samples meanwhile)
    forward(role, sequences[, temperature])  a no-grad forward: "policy", "reference", "critic",
                                         "reward_model" (rlhf/rl/roles/assemble.py Roles.forward_of)
    sample(prompts, sampling, seed)      an evaluator's sampling from a seed of its own (the held-out
                                         evaluation of `rlhf demo`: rlhf/demo/held_out.py)
    train(roles, minibatches)            the optimizer steps of "policy" and/or "critic"
    use_ptx(batches, coef, seed)         PPO-ptx's SFT rows (data.collate.PtxBatches), drawn by the policy
    save_checkpoint, load_checkpoint     a checkpoint's weights (whole, or each rank's shards) and state
    export, close                        the trained models at the end; what the runtime started, freed
    tokenizer, device, policy_context, has_role, learner_names, learning_rates, writer: the facts

and schedules the rows inside (`map_rows`: threads here, ranks under torchrun).
"""

from rlhf.runtime.distributed import DistributedRuntime, runtime_for
from rlhf.runtime.local import LocalRuntime

__all__ = ["DistributedRuntime", "LocalRuntime", "runtime_for"]
