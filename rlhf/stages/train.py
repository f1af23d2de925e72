"""`rlhf train`: the RL stage from its config: load the roles and the prompts, run the trainer,
write the report and print the summary."""

from __future__ import annotations

from rlhf.config import RLConfig
from rlhf.data.tokenize import TruncationStats
from rlhf.monitor import print_summary
from rlhf.rl.roles.assemble import load_roles
from rlhf.rl.trainer import RLTrainer
from rlhf.rundir.final_report import write_final_report
from rlhf.runtime import runtime_for
from rlhf.stages.prompt_files import load_prompts, prompt_rows, ptx_sampler
from rlhf.train.context_check import check_prompts_fit, model_context


def run_rl(config: RLConfig, *, resume: bool = False, evaluator=None, quiet: bool = False) -> dict:
    from rlhf.rl.reward_functions import check_row_fields, load_reward_functions

    # a malformed name, a module that fails to import or a function that cannot be called stops
    # here, before any model loads (imported once: the trainer's own load finds them imported)
    functions = load_reward_functions(config.reward.functions)
    roles = load_roles(config)
    stats = TruncationStats()
    prompts, sources = load_prompts(
        roles.tokenizer,
        config.data.prompts,
        format=config.data.format,
        max_tokens=config.data.max_prompt_tokens,
        skip_invalid=config.data.skip_invalid,
        stats=stats,
        chat_template=config.data.chat_template,
    )
    check_prompts_fit(
        prompts,
        sources,
        context=model_context(roles.policy.model),
        max_new_tokens=config.rollout.max_new_tokens,
        model_name=f"the policy {config.model.policy}",
        fix="--data.max_prompt_tokens {budget} (longer prompts are left-truncated to it), or a lower "
        "--rollout.max_new_tokens",
    )
    ptx = None
    if config.data.ptx and config.policy.ptx_coef > 0:
        ptx = ptx_sampler(
            roles.tokenizer,
            config.data.ptx,
            config.data.ptx_batch_size,
            config.data.max_prompt_tokens,
            chat_template=config.data.chat_template,
        )
    rows = prompt_rows(config.data.prompts, sources) if config.reward.functions else None
    if rows is not None:
        check_row_fields(functions, rows, str(config.data.prompts))
    trainer = RLTrainer(
        config,
        roles,
        prompts,
        ptx_batches=ptx,
        evaluator=evaluator,
        resume=resume,
        quiet=quiet,
        runtime=runtime_for(roles, config),
        prompt_rows=rows,
    )
    final = trainer.train()
    if not trainer.runtime.writer:
        return final  # rank 0 writes the report and prints the summary
    report = write_final_report(config.out)
    if not quiet:
        shown = {k: v for k, v in final.items() if isinstance(v, (int, float)) and not k.startswith("time/")}
        print_summary(f"RL run finished: {config.out}", shown)
        print(f"report: {report}")  # a line of its own: the table would cut a long path
    return final
