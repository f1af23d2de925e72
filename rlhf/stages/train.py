"""`rlhf train`: the RL stage from its config: load the roles and the prompts, run the trainer,
write the report and print the summary."""

from __future__ import annotations

import sys
from typing import Any

from rlhf.config import RLConfig
from rlhf.config.env import response_budget
from rlhf.data.tokenize import TruncationStats
from rlhf.models.loading import load_tokenizer, prepare_tokenizer
from rlhf.models.tokenizer_match import check_same_tokenizer
from rlhf.monitor import print_summary
from rlhf.parallel.process_group import is_writer_process, sharded_launch
from rlhf.rl.roles.assemble import load_roles
from rlhf.rl.trainer import Evaluator, RLTrainer
from rlhf.rundir.final_report import write_final_report
from rlhf.rundir.footprint import footprint_line
from rlhf.rundir.run_inputs import model_inputs, record_models
from rlhf.runtime import runtime_for
from rlhf.runtime.protocol import Runtime
from rlhf.stages.prompt_files import load_prompts, prompt_rows, ptx_sampler
from rlhf.train.context_check import check_prompts_fit


def run_rl(
    config: RLConfig, *, resume: bool = False, evaluator: Evaluator | None = None, quiet: bool = False
) -> dict[str, Any]:
    from rlhf.rl.reward_functions import load_reward_functions

    # a malformed name, a module that fails to import or a function that cannot be called stops
    # here, before any model loads (imported once: the trainer's own load finds them imported)
    functions = load_reward_functions(config.reward.functions)
    if config.env.name:  # the environment class likewise (docs/environments.md)
        from rlhf.envs import load_environment

        load_environment(config.env.name)
    if config.agent.name:  # and the agent function
        from rlhf.agents import load_agent

        load_agent(config.agent.name)
    check_reward_model_tokenizer(config)
    check_reward_server(config)
    writer = is_writer_process()
    inputs = model_inputs(config) if writer and not resume else None  # the files, before they are read
    runtime = start_runtime(config, writer)
    try:
        return train_with(config, runtime, functions, inputs, resume, evaluator, quiet)
    finally:
        runtime.close()  # Ray's actors and placement groups


def start_runtime(config: RLConfig, writer: bool) -> Runtime:
    """The run's runtime, its roles built: on Ray actors, or in this process (alone or a torchrun rank).
    An in-loop evaluator asks `trainer.runtime` (sample, forward) wherever the roles are."""
    if config.dist.runtime == "ray":
        from rlhf.ray_runtime import RayRuntime

        return RayRuntime(config)
    # fsdp2 under torchrun: rank 0 alone reads the weights, the others build the models' structure on
    # the meta device and receive their shards from rank 0 (rlhf/parallel/fsdp.py shard_from_rank0)
    roles = load_roles(config, on_meta=sharded_launch(config.dist.strategy) and not writer)
    return runtime_for(roles, config)


def train_with(
    config: RLConfig,
    runtime: Runtime,
    functions: list[Any],
    inputs: Any,
    resume: bool,
    evaluator: Evaluator | None,
    quiet: bool,
) -> dict[str, Any]:
    """The run with its roles started: the prompts and PPO-ptx rows read, the loop, the summary."""
    from rlhf.rl.reward_functions import check_row_fields

    tokenizer = runtime.tokenizer
    context = runtime.policy_context
    stats = TruncationStats()
    prompts, sources = load_prompts(
        tokenizer,
        config.data.prompts,
        format=config.data.format,
        max_tokens=config.data.max_prompt_tokens,
        skip_invalid=config.data.skip_invalid,
        stats=stats,
        chat_template=config.data.chat_template,
        system_prompt=config.data.system_prompt,
    )
    if runtime.writer and not quiet:
        print(f"prompts of {config.data.prompts}: {stats.summary()}")
    check_prompts_fit(
        prompts,
        sources,
        context=context,
        max_new_tokens=response_budget(config.env, config.rollout.max_new_tokens)
        if config.env.name
        else config.rollout.max_new_tokens,
        model_name=f"the policy {config.model.policy}",
        fix="--data.max_prompt_tokens {budget} (longer prompts are left-truncated to it), or a lower "
        + ("--env.max_tokens" if config.env.name else "--rollout.max_new_tokens"),
    )
    ptx = None
    if config.data.ptx and config.policy.ptx_coef > 0:
        ptx = ptx_sampler(
            tokenizer,
            config.data.ptx,
            config.data.ptx_batch_size,
            config.data.max_prompt_tokens,
            chat_template=config.data.chat_template,
            system_prompt=config.data.system_prompt,
        )
    wants_rows = config.reward.functions or config.env.name or config.agent.name  # episodes read their row
    rows = prompt_rows(config.data.prompts, sources) if wants_rows else None
    if rows is not None and functions:
        check_row_fields(functions, rows, str(config.data.prompts))
    trainer = RLTrainer(
        config,
        runtime,
        prompts,
        ptx_batches=ptx,
        evaluator=evaluator,
        resume=resume,
        quiet=quiet,
        prompt_rows=rows,
    )
    if inputs is not None:  # the run directory is claimed (no earlier run in it): record what it reads
        record_models(config.out, inputs)
    final = trainer.train()
    final.update({f"data/{k}": v for k, v in stats.as_dict().items() if v is not None})
    if not trainer.runtime.writer:
        return final  # rank 0 writes the report and prints the summary
    report = write_final_report(config.out)
    if not quiet:
        shown = {k: v for k, v in final.items() if isinstance(v, (int, float)) and not k.startswith("time/")}
        print_summary(f"RL run finished: {config.out}", kl_first(shown))
        print(footprint_line(config.out, config.checkpoint.keep))  # what the directory keeps, and why
        print(f"report: {report}")  # last, a line of its own: the table would cut a long path
    return final


def kl_first(shown: dict[str, Any]) -> dict[str, Any]:
    """The summary's rows with the KL to the reference led by k3 (`kl/k3`, never negative), then
    the configured estimator's `kl/ref` (k1 by default: unbiased, but negative when the sampled
    tokens happen to be likelier under the reference)."""
    if "kl/k3" not in shown:
        return shown
    rows: dict[str, Any] = {}
    for key, value in shown.items():
        if key.startswith("kl/") and "kl/k3" not in rows:
            rows["kl/k3"] = shown["kl/k3"]
        rows.setdefault(key, value)
    return rows


def check_reward_server(config: RLConfig) -> None:
    """A --reward-url server answers GET /health before any model loads (exit 2 naming the URL
    otherwise); a note when it will score the texts with a tokenizer other than the policy's. An LLM
    judge likewise: its key variable read (exit 2 naming it when unset), its server probed
    (`LLMJudge.check_server`: up, and serving --judge-model)."""
    if config.reward.llm_judge.url:
        from rlhf.rl.llm_judge import LLMJudge

        LLMJudge(config.reward.llm_judge, "pointwise").check_server()
    if not config.reward.remote.url:
        return
    from rlhf.rl.remote_reward import RemoteReward

    policy = prepare_tokenizer(load_tokenizer(config.model.policy, gguf_file=config.model.gguf_file))
    client = RemoteReward(config.reward.remote, policy)
    note = client.tokenizer_note(client.health())
    if note is not None and is_writer_process():
        print(f"note: {note}", file=sys.stderr)


def check_reward_model_tokenizer(config: RLConfig) -> None:
    """The reward model reads the policy's token ids: both must have one tokenizer (exit 2 otherwise)."""
    if not config.model.reward_model:
        return
    policy = load_tokenizer(config.model.policy, gguf_file=config.model.gguf_file)
    check_same_tokenizer(
        policy,
        f"--policy {config.model.policy}",
        config.model.reward_model,
        f"--reward-model {config.model.reward_model}",
        fix=f"pass a reward model trained from the policy's base model (e.g. `rlhf rm --model "
        f"{config.model.policy} --data PAIRS --out runs/rm`), or the --policy the reward model was trained with",
    )
