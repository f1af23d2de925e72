"""Runtimes place the roles (rlhf/rl/roles/) and schedule their work; the RL loop is the same
for all of them.

    local        one process, CPU or one GPU (threads that overlap critic and policy live here)
    distributed  torchrun: every rank holds every role and a share of the rows; gradients summed
    ray          role groups on Ray actors across machines (rlhf/ray_runtime/, above rl: it builds roles)

The loop calls a runtime's roles by name, on plain batches (no callables or generators cross):

    generate(prompts, return_logprobs)   the policy's rollout (its own random state draws)
    forward(role, sequences[, temperature])  a no-grad forward: "policy", "reference", "critic",
                                         "reward_model" (rlhf/rl/roles/assemble.py Roles.forward_of)
    sample(prompts, sampling, seed)      an evaluator's sampling from a seed of its own (the held-out
                                         evaluation of `rlhf demo`: rlhf/demo/held_out.py)
    train(roles, minibatches)            the optimizer steps of "policy" and/or "critic"
    whole_models(), whole_model(model)   the whole parameters, for saving and exporting
    tokenizer, device, has_role, learner_names, learning_rates, role_state, load_role_state,
    save_weights, load_weights, export, release_optimizer_state, use_ptx: the roles' facts and state

and schedules the rows inside (`map_rows`: threads here, ranks under torchrun).
"""

from rlhf.runtime.distributed import DistributedRuntime, runtime_for
from rlhf.runtime.local import LocalRuntime

__all__ = ["DistributedRuntime", "LocalRuntime", "runtime_for"]
