"""`rlhf eval`: two policies answer the same held-out prompts, a judge scores both, and the paired
comparison (mean reward with intervals, win rate, and how much of it the answers' lengths explain:
the length-controlled and length-matched win rates, docs/algorithms.md §33) is written to eval.json.
With `--reward-fn`, each function's mean on the policy's answers with its interval (an accuracy with
its Wilson interval for a 0/1 verifier), and against a `--baseline` the paired difference
(eval.json's "reward_functions", docs/algorithms.md §40); `--reward-fn` alone needs no baseline."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from rlhf.config import ConfigError, EvalConfig
from rlhf.data.chat import stop_token_ids
from rlhf.data.loading import load_examples
from rlhf.data.tokenize import TruncationStats, encode_prompt
from rlhf.evaluation.accuracy import function_figures
from rlhf.evaluation.judging import (
    check_finite_scores,
    compare_scores,
    mean_with_ci,
    paired_samples,
    reward_model_judge,
    sample_responses,
    score_rollouts,
)
from rlhf.evaluation.label_pairs import label_pair_verdict, pair_logprobs
from rlhf.evaluation.length_control import judge_length_bias
from rlhf.evaluation.sample_kl import response_logprob_sums, sample_kl
from rlhf.models.backbone import model_context
from rlhf.models.device import resolve_device
from rlhf.models.loading import load_causal_lm, load_tokenizer, prepare_tokenizer
from rlhf.models.precision import Precision
from rlhf.models.sampling import SamplingConfig
from rlhf.models.tokenizer_match import check_same_tokenizer
from rlhf.monitor import print_summary
from rlhf.monitor.progress import WorkProgress, announce
from rlhf.monitor.run_files import recorded_data_settings
from rlhf.stages.eval_llm_judge import judge_pairs, llm_judge, print_llm_judge_summary
from rlhf.stages.prompt_files import prompt_rows
from rlhf.stages.result_files import refuse_foreign_file, refuse_replacing_other_result, write_result
from rlhf.train.context_check import check_prompts_fit


def run_eval(config: EvalConfig) -> dict:
    """`rlhf eval`: both policies answer the same held-out prompts; the judge scores; paired comparison.
    With `reward_functions`, also each function's figures (docs/algorithms.md §40); with them alone and
    no `baseline`, only the policy answers and those figures are the result. With `data.pairs`, also
    the verdict of held-out human labels (eval.json's "pairs", docs/algorithms.md §38): both policies
    score the same preference pairs. Every model runs on
    `device` under the `dtype` policy. `config` is validated (load_config)."""
    data = config.data
    device = resolve_device(config.device, key="device")
    precision = Precision.resolve(config.dtype, device, key="dtype")
    check_result_path(config)  # before any work: --out is a new file or an earlier eval.json
    tokenizer = prepare_tokenizer(load_tokenizer(config.policy, gguf_file=config.gguf_file))
    _check_tokenizers(config, tokenizer)
    judge_client = llm_judge(config)  # its API key read, its server probed, before any model loads
    pairs = _read_label_pairs(config, tokenizer) if data.pairs else None  # a bad file stops before models
    prompts_run = _prepare_prompts(config, tokenizer, precision) if data.prompts else None
    texts, pair_logps, kl_logps, policy_rollouts = _answer_with_each_model(
        config, tokenizer, precision, device, prompts_run, pairs
    )
    if prompts_run is not None and not config.baseline:
        results = _accuracy_result(config, prompts_run, texts["policy"], tokenizer)
    elif prompts_run is not None:
        results = _comparison_result(
            config, prompts_run, texts, kl_logps, policy_rollouts, tokenizer, judge_client
        )
    else:  # the label verdict alone: no judge, no prompts
        results = {
            "policy": {"path": str(config.policy)},
            "baseline": {"path": str(config.baseline)},
            "judge": None,
            "judges": {},
            "prompts": None,
        }
    if pairs is not None:
        results["pairs"] = label_pairs_result(pairs, pair_logps["policy"], pair_logps["baseline"])
    out = eval_result_path(config)
    write_result(out, results)
    _print_summaries(config, results, out, prompts_run)
    return results


def _answer_with_each_model(config: EvalConfig, tokenizer, precision, device, prompts_run, pairs):
    """Load the policy (then the baseline), one at a time: its answers to the prompts and their
    scores, its log-probs of the policy's answers (eval.json's "kl") and of the label pairs.
    Returns (texts, pair log-probs, KL log-probs, the policy's rollouts), each keyed by side."""
    texts, pair_logps, kl_logps = {}, {}, {}
    policy_rollouts: list = []
    sides = [("policy", config.policy, config.gguf_file)]
    if config.baseline:  # none: --reward-fn alone, each function's figures on the policy's answers
        sides.append(("baseline", config.baseline, config.baseline_gguf_file))
    for name, path, gguf_file in sides:
        with announce(f"loading --{name} {path}"):
            model = precision.prepare(
                load_causal_lm(path, gguf_file=gguf_file, dtype=precision.param_dtype, device=device)
            )
        if prompts_run is not None:
            rollouts, texts[name] = _answer_and_score(
                prompts_run, name, path, model, tokenizer, config, precision
            )
            policy_rollouts = rollouts if name == "policy" else policy_rollouts
            if config.baseline:
                with announce(f"eval --{name}: log-probs of the policy's answers"):  # eval.json's "kl"
                    kl_logps[name] = response_logprob_sums(model, policy_rollouts, precision)
        if pairs is not None:
            pair_logps[name] = _pair_logprobs(name, path, model, pairs, tokenizer, config, precision)
        del model
    return texts, pair_logps, kl_logps, policy_rollouts


def _comparison_result(
    config: EvalConfig, prompts_run: dict, texts, kl_logps, policy_rollouts, tokenizer, judge_client
) -> dict:
    """eval.json of the policy against the baseline on the prompts: each judge's paired figures (the
    first on top), the settings, the sample KL, every prompt's answers, the LLM judge's verdicts and
    each reward function's paired figures."""
    data = config.data
    judges, scores = prompts_run["judges"], prompts_run["scores"]
    paths = {"policy": config.policy, "baseline": config.baseline}
    per_judge = {name: judged(paths, texts, scores[name], name, config.seed) for name in judges}
    judge_name = next(iter(judges), None)  # None: the LLM judge's verdicts alone
    sides = {side: {"path": str(paths[side])} for side in paths}
    top = per_judge[judge_name] if judge_name is not None else {**sides, "judge": None}
    results = {**top, "judges": per_judge}  # the first judge's figures on top
    results["prompts"] = str(data.prompts)
    results["truncation"] = prompts_run["truncation"].as_dict()
    results["system_prompt"] = prompts_run["system_prompt"]
    results["sampling"] = sampling_record(prompts_run["sampling"])
    results["max_prompt_tokens"] = prompts_run["budget"]
    lengths = torch.cat([r.response_mask.sum(-1).cpu() for r in policy_rollouts])
    results["kl"] = sample_kl(kl_logps["policy"], kl_logps["baseline"], lengths, results["sampling"])
    examples, prompts = prompts_run["examples"], prompts_run["prompts"]
    results["samples"] = paired_samples(
        [ex.prompt for ex in examples],
        [ex.source for ex in examples],
        texts,
        scores[judge_name] if judge_name is not None else None,
    )
    for sample, ids in zip(results["samples"], prompts):  # the prompt as the models saw it
        sample["prompt_seen"] = tokenizer.decode(ids)
    if judge_client is not None:  # each pair judged twice, positions swapped (§33)
        shown = [judge_prompt(ex.prompt, ids, tokenizer) for ex, ids in zip(examples, prompts)]
        results["llm_judge"] = judge_pairs(judge_client, shown, texts["policy"], texts["baseline"])
        for sample, verdict in zip(results["samples"], results["llm_judge"]["verdicts"]):
            sample["llm_judge_verdict"] = verdict
    values = prompts_run["function_values"]
    if values["policy"]:
        results["reward_functions"] = {
            fn: function_figures(values["policy"][fn].tolist(), values["baseline"][fn].tolist())
            for fn in values["policy"]
        }
        for i, sample in enumerate(results["samples"]):
            for side in ("policy", "baseline"):
                sample[f"{side}_function_scores"] = {fn: float(v[i]) for fn, v in values[side].items()}
    return results


def _print_summaries(config: EvalConfig, results: dict, out, prompts_run) -> None:
    """The one-screen summaries of what eval.json holds: per judge, the LLM judge, the reward
    functions and the label pairs."""
    if prompts_run is not None and config.baseline:
        for name in prompts_run["judges"]:
            _print_eval_summary(
                config, {**results["judges"][name], "kl": results["kl"]}, name, out, results["truncation"]
            )
    if "llm_judge" in results:
        print_llm_judge_summary(config, results["llm_judge"], out)
    if "reward_functions" in results:
        _print_accuracy_summary(config, results, out)
    if "pairs" in results:
        _print_pairs_summary(config, results["pairs"], out)


def _accuracy_result(config: EvalConfig, run: dict, texts: list[str], tokenizer) -> dict:
    """eval.json without a baseline: each reward function's figures on the policy's answers
    (`function_figures`), the settings, and every prompt's answer with each function's value."""
    values = run["function_values"]["policy"]
    examples = run["examples"]
    return {
        "policy": {"path": str(config.policy)},
        "baseline": None,
        "judge": None,
        "judges": {},
        "reward_functions": {fn: function_figures(v.tolist()) for fn, v in values.items()},
        "prompts": str(config.data.prompts),
        "truncation": run["truncation"].as_dict(),
        "system_prompt": run["system_prompt"],
        "sampling": sampling_record(run["sampling"]),
        "max_prompt_tokens": run["budget"],
        "samples": [
            {
                "source": str(ex.source) if ex.source is not None else None,
                "prompt": ex.prompt,
                "prompt_seen": tokenizer.decode(ids),
                "policy_response": text,
                "policy_function_scores": {fn: float(v[i]) for fn, v in values.items()},
            }
            for i, (ex, ids, text) in enumerate(zip(examples, run["prompts"], texts))
        ],
    }


def judge_prompt(prompt, ids: list[int], tokenizer) -> str:
    """The prompt an LLM judge reads: the file's text, or a dialogue as the policy read it (special
    tokens left out)."""
    return prompt if isinstance(prompt, str) else tokenizer.decode(ids, skip_special_tokens=True).strip()


def sampling_record(sampling: SamplingConfig) -> dict:
    """eval.json's "sampling": how the answers were drawn (do_sample false: greedy)."""
    return {k: getattr(sampling, k) for k in ("temperature", "top_p", "repetition_penalty", "do_sample")}


def _prepare_prompts(config: EvalConfig, tokenizer, precision: Precision) -> dict:
    """The held-out prompts encoded, the sampling settings and the judges of the win rates."""
    data = config.data
    skip = data.skip_invalid
    examples = load_examples(data.prompts, kind="prompt", skip_invalid=skip).examples[: data.n]
    budget = eval_prompt_budget(config)
    system_prompt = eval_system_prompt(config)
    truncation = TruncationStats()
    prompts = [
        encode_prompt(
            tokenizer,
            ex.prompt,
            budget,
            stats=truncation,
            chat_template=data.chat_template,
            system_prompt=system_prompt,
        )
        for ex in examples
    ]
    sources = [ex.source for ex in examples]
    reward_fns = config.reward_functions
    values: dict[str, list[torch.Tensor]] = {}  # each function's own values, as the first judge calls it
    if reward_fns:  # Python reward functions added to the judge's score (docs/algorithms.md §31)
        from rlhf.rl.reward_functions import check_row_fields, judge_with_functions, load_reward_functions

        functions = load_reward_functions(reward_fns, key="--reward-fn")  # before any model loads
        rows = prompt_rows(data.prompts, sources)
        check_row_fields(functions, rows, str(data.prompts))
    judges = {}  # judge name -> judge factory; every judge scores the same answers
    specs = [config.judge, *config.extra_judges] if config.judge else [None] if reward_fns else []
    for spec in specs:  # none: the LLM judge's verdicts alone (--judge-url)
        judge = None
        if spec:
            with announce(f"loading the judge {spec}"):
                judge = _load_judge(spec, tokenizer, data.prompts, data.n, skip, precision)
        if reward_fns:
            sink = values if not judges else None  # the first judge's calls give the functions' figures
            judge = judge_with_functions(judge, functions, tokenizer, rows, sink)
        judges[" + ".join([*([str(spec)] if spec else []), *map(str, reward_fns)])] = judge
    return {
        "examples": examples,
        "prompts": prompts,
        "sources": sources,
        "budget": budget,
        "system_prompt": system_prompt,
        "truncation": truncation,
        "sampling": eval_sampling(config.rollout),
        "judges": judges,
        "scores": {name: {} for name in judges},  # scores[judge][policy or baseline]
        "values": values,  # filled while a side is scored, emptied into function_values
        "function_values": {},  # function_values[policy or baseline][function]: values [n]
    }


def _answer_and_score(run: dict, name: str, path, model, tokenizer, config: EvalConfig, precision):
    """The `--name` policy's answers to the prompts (rollouts, texts), every judge's scores of them in
    `run`."""
    prompts, sources = run["prompts"], run["sources"]
    check_prompts_fit(
        prompts,
        sources,
        context=model_context(model),
        max_new_tokens=config.rollout.max_new_tokens,
        model_name=f"--{name} {path}",
        fix="shorten that prompt (at most {budget} tokens) or remove it, or lower --max-new-tokens",
        budget_flag="--max-new-tokens",
    )
    stop_ids = stop_token_ids(tokenizer, config.data.chat_template)
    rollouts, texts = _answer(name, model, tokenizer, prompts, run["sampling"], config, precision, stop_ids)
    judges = run["judges"]
    for judge_name, judge in judges.items():
        shown = f" ({judge_name})" if len(judges) > 1 else ""  # which judge, when several
        run["scores"][judge_name][name] = _score(name, path, rollouts, texts, judge, judge_name, shown)
    run["function_values"][name] = {fn: torch.cat(batches) for fn, batches in run["values"].items()}
    run["values"].clear()
    return rollouts, texts


DEFAULT_PAIR_RESPONSE_TOKENS = 512  # for policies that record no response budget


def pair_response_budget(config: EvalConfig) -> int:
    """The pairs' response budget: data.max_response_tokens, else the --policy run's (its config.yaml),
    else the --baseline run's (a PPO run records none; its SFT baseline does), else 512."""
    if config.data.max_response_tokens is not None:
        return config.data.max_response_tokens
    for directory in (config.policy, config.baseline):
        recorded = recorded_data_settings(directory).get("max_response_tokens")
        if isinstance(recorded, int) and not isinstance(recorded, bool) and recorded >= 1:
            return recorded
    return DEFAULT_PAIR_RESPONSE_TOKENS


def _read_label_pairs(config: EvalConfig, tokenizer) -> dict:
    """The held-out pairs, read as `rlhf rm` reads pairs (every pair format; a malformed line stops
    with its file and line unless --skip-invalid, which skips and counts it) and encoded under the
    prompt budget of the win rates and the pairs' response budget."""
    from rlhf.config import RewardConfig, RewardDataConfig
    from rlhf.stages.rm import encode_pairs

    data = config.data
    loaded = load_examples(data.pairs, kind="preference", skip_invalid=data.skip_invalid)
    examples = loaded.examples[: data.pairs_n] if data.pairs_n else loaded.examples
    settings = RewardDataConfig(
        path=str(data.pairs),
        max_prompt_tokens=eval_prompt_budget(config),
        max_response_tokens=pair_response_budget(config),
        chat_template=data.chat_template,
        system_prompt=eval_system_prompt(config),
    )
    stats = TruncationStats()
    rows = encode_pairs(tokenizer, examples, RewardConfig(data=settings), stats)
    return {
        "examples": examples,
        "rows": rows,
        "read": len(loaded.examples),
        "skipped": loaded.skipped,
        "reasons": [str(error) for error in loaded.errors[:20]],
        "truncation": stats,
        "settings": settings,
    }


def _pair_logprobs(name, path, model, pairs: dict, tokenizer, config: EvalConfig, precision):
    """The `--name` model's summed log-probs of every pair's chosen and rejected response."""
    rows = pairs["rows"]
    context = model_context(model)
    if context is not None:
        for row, example in zip(rows, pairs["examples"]):
            length = len(row.prompt_ids) + max(len(row.chosen_ids), len(row.rejected_ids))
            if length > context:
                raise ConfigError(
                    f"{example.source}: the pair takes {length} tokens, more than the {context} positions "
                    f"of --{name} {path}. Fix: lower --data.max_prompt_tokens or --data.max_response_tokens.",
                    "data.pairs",
                )
    with WorkProgress(f"eval --{name}: held-out pairs", len(rows), "pair") as progress:
        chosen, rejected = pair_logprobs(
            model,
            [r.prompt_ids for r in rows],
            [r.chosen_ids for r in rows],
            [r.rejected_ids for r in rows],
            tokenizer.pad_token_id,
            config.data.pairs_batch_size,
            precision=precision,
            on_batch=progress.advance,
        )
    return chosen, rejected


def label_pairs_result(pairs: dict, policy: tuple, baseline: tuple) -> dict:
    """eval.json's "pairs": the verdict (label_pairs.label_pair_verdict), how the file was read and
    encoded, and every pair's two log-ratios."""
    rows = pairs["rows"]
    try:
        verdict = label_pair_verdict(
            policy[0],
            policy[1],
            baseline[0],
            baseline[1],
            [len(r.chosen_ids) for r in rows],
            [len(r.rejected_ids) for r in rows],
        )
    except ValueError as error:  # a NaN log-prob: the model, not the file
        raise ConfigError(
            f"held-out pairs: {error}. Fix: check the model (its dtype, its weights).", "data.pairs"
        ) from error
    settings = pairs["settings"]
    return {
        **verdict,
        "file": settings.path,
        "pairs_read": pairs["read"],
        "skipped_invalid": pairs["skipped"],
        "skipped_reasons": pairs["reasons"],
        "max_prompt_tokens": settings.max_prompt_tokens,
        "max_response_tokens": settings.max_response_tokens,
        "truncation": pairs["truncation"].as_dict(),
        "per_pair": [
            {
                "source": str(ex.source),
                "chosen_logratio": float(pc - bc),
                "rejected_logratio": float(pr - br),
                "chosen_tokens": len(r.chosen_ids),
                "rejected_tokens": len(r.rejected_ids),
            }
            for ex, r, pc, pr, bc, br in zip(
                pairs["examples"], rows, policy[0], policy[1], baseline[0], baseline[1]
            )
        ],
    }


def _print_accuracy_summary(config: EvalConfig, results: dict, out: Path) -> None:
    """The one-screen summary of the reward functions' figures (eval.json's "reward_functions")."""
    against = f" vs {config.baseline}" if config.baseline else ""
    functions = results["reward_functions"]
    short = {fn: fn.rpartition(":")[2] for fn in functions}  # the function's name, when unique
    label = {fn: short[fn] if list(short.values()).count(short[fn]) == 1 else fn for fn in functions}
    rows = {}
    for fn, figures in functions.items():
        rows[label[fn]] = mean_row(figures)
        if "baseline" in figures:
            rows[f"{label[fn]}, baseline"] = mean_row(figures["baseline"])
            rows[f"{label[fn]}, policy - baseline"] = difference_row(figures["difference"])
    n = next(iter(functions.values()))["n"]
    print_summary(
        f"eval: {config.policy}{against} (reward functions, n={n})",
        {**rows, "prompts truncated": truncation_row(results["truncation"]), "written": str(out)},
    )


def mean_row(figures: dict) -> str:
    """`0.420 [0.293, 0.558] 21/50, Wilson 95%` or `1.2345 [1.0012, 1.4678] t 95%`."""
    spec = ".3f" if figures["interval"] == "wilson" else ".4f"
    ci = figures["ci95"]
    interval = f" [{ci[0]:{spec}}, {ci[1]:{spec}}]" if ci else ""
    if figures["interval"] == "wilson":
        return f"{figures['mean']:{spec}}{interval} {figures['correct']}/{figures['n']}, Wilson 95%"
    return f"{figures['mean']:{spec}}{interval} t 95%{' (none for n = 1)' if not ci else ''}"


def difference_row(difference: dict) -> str:
    """`+0.060 [-0.052, +0.172] paired t 95%; W/T/L 5/40/2` (wins / ties / losses)."""
    ci = difference["ci95"]
    interval = f" [{ci[0]:+.3f}, {ci[1]:+.3f}]" if ci else ""
    counts = f"{difference['wins']}/{difference['ties']}/{difference['losses']}"
    return f"{difference['mean']:+.3f}{interval} paired t 95%; W/T/L {counts}"


def _print_pairs_summary(config: EvalConfig, pairs: dict, out: Path) -> None:
    def interval(value, ci, spec=".3f"):
        return "-" if value is None else f"{value:{spec}} [{ci[0]:{spec}}, {ci[1]:{spec}}]"

    print_summary(
        f"eval: held-out human labels (n={pairs['n']})",
        {
            "policy / baseline": f"{config.policy} / {config.baseline}",
            "accuracy (ties half)": interval(pairs["accuracy"], pairs["ci95"]) + " (Wilson 95%)",
            "wins / ties / losses": f"{pairs['wins']} / {pairs['ties']} / {pairs['losses']}",
            "margin, nats": interval(pairs["margin_mean"], pairs["margin_ci95"], "+.4f"),
            "log-ratio chosen / rejected": "-"
            if pairs["chosen_logratio_mean"] is None
            else f"{pairs['chosen_logratio_mean']:+.4f} / {pairs['rejected_logratio_mean']:+.4f}",
            "per-token accuracy": interval(pairs.get("per_token_accuracy"), pairs.get("per_token_ci95")),
            "skipped (invalid)": str(pairs["skipped_invalid"]),
            "pairs truncated": truncation_row(pairs["truncation"]),
            "written": str(out),
        },
    )


def judged(paths: dict, texts: dict, scores: dict, judge_name: str, seed: int) -> dict:
    """One judge's figures of the paired comparison: each side's mean score with its interval, the
    win rate, and the length figures (docs/algorithms.md §33)."""
    result = {
        name: {"path": str(paths[name]), **mean_with_ci(scores[name])} for name in ("policy", "baseline")
    }
    result["comparison"] = compare_scores(scores["policy"], scores["baseline"])
    result["length"] = judge_length_bias(
        texts["policy"],
        texts["baseline"],
        scores["policy"].tolist(),
        scores["baseline"].tolist(),
        seed=seed,
    )
    result["judge"] = judge_name
    return result


def _check_tokenizers(config: EvalConfig, tokenizer) -> None:
    """The baseline and the judge read the policy tokenizer's ids: their tokenizers must be its."""
    judges = [("--judge", judge) for judge in (config.judge, *config.extra_judges)]  # every judge alike
    for flag, other in (("--baseline", config.baseline), *judges):
        if other and not str(other).startswith("world:"):
            check_same_tokenizer(
                tokenizer,
                f"--policy {config.policy}",
                other,
                f"{flag} {other}",
                fix=f"compare models trained from one base model: pass a {flag} whose tokenizer is the policy's",
            )


def eval_sampling(rollout) -> SamplingConfig:
    """How both policies answer: temperature 0 is greedy (the most likely answer, as other tools read
    it); `rollout.sampling paper` is the PPO paper's §6.1 settings."""
    if rollout.sampling == "paper":
        return SamplingConfig.ppo_paper(max_new_tokens=rollout.max_new_tokens)
    greedy = rollout.temperature == 0
    return SamplingConfig(
        max_new_tokens=rollout.max_new_tokens,
        temperature=1.0 if greedy else rollout.temperature,
        top_p=rollout.top_p,
        do_sample=not greedy,
    )


def _answer(name, model, tokenizer, prompts, sampling, config, precision, stop_ids):
    """(rollouts, response texts) of the `--name` policy on the prompts, with progress."""
    with WorkProgress(f"eval --{name}: sampling", len(prompts), "prompt") as progress:
        rollouts, texts = sample_responses(
            model,
            tokenizer,
            prompts,
            sampling,
            seed=config.seed,
            precision=precision,
            on_batch=progress.advance,
            stop_ids=stop_ids,
        )
    return rollouts, texts


def _score(name, path, rollouts, texts, judge, judge_name, shown=""):
    """The judge's scores of the `--name` policy's answers, with progress."""
    with WorkProgress(f"eval --{name}: scoring{shown}", len(texts), "response") as progress:
        scores = score_rollouts(rollouts, texts, judge, on_batch=progress.advance)
    check_finite_scores(scores, judge_name, f"--{name} {path}")
    return scores


def _print_eval_summary(
    config: EvalConfig, results: dict, judge_name: str, out: Path, truncation: dict | None = None
) -> None:
    """The one-screen summary, and the warning when the judge's preference follows length."""
    cmp = results["comparison"]

    def reward(name: str) -> str:
        mean, low = results[name]["mean"], results[name]["ci95"][0]
        return f"{mean:.4f} ± {mean - low:.4f}"

    print_summary(
        f"eval: {config.policy} vs {config.baseline} (judge {judge_name}, n={cmp['n']})",
        {
            "policy reward": reward("policy"),
            "baseline reward": reward("baseline"),
            "win / tie / loss": f"{cmp['win']:.3f} / {cmp['tie']:.3f} / {cmp['loss']:.3f}",
            "win rate (ties half)": f"{cmp['win_rate']:.3f} [{cmp['win_rate_ci95'][0]:.3f}, {cmp['win_rate_ci95'][1]:.3f}]",
            **length_summary(results["length"]),
            **({"KL to baseline, nats an answer": kl_row(results["kl"])} if "kl" in results else {}),
            **({"prompts truncated": truncation_row(truncation)} if truncation else {}),
            "written": str(out),
        },
    )
    if results["length"]["warning"]:
        print(f"warning: {results['length']['warning']}", file=sys.stderr)


def kl_row(kl: dict) -> str:
    if kl["mean"] is None:
        return "-"
    interval = f" [{kl['ci95'][0]:.3f}, {kl['ci95'][1]:.3f}]" if kl["ci95"] else ""
    return f"{kl['mean']:.3f}{interval}, {kl['per_token']:.4f} a token"


# what makes a JSON file an earlier eval.json (judge: None in a result of --pairs only)
EVAL_KEYS = ("policy", "baseline", "judge")


def eval_result_path(config: EvalConfig) -> Path:
    return Path(config.out) if config.out else Path(config.policy) / "eval.json"


def check_result_path(config: EvalConfig) -> None:
    """Refuse an --out that is not a new file nor an earlier `rlhf eval` result (it would be replaced),
    and, without --out, an eval.json of other prompts or another baseline (a comparison of its own)."""
    path = eval_result_path(config)
    refuse_foreign_file(
        path, EVAL_KEYS, "rlhf eval", "eval.json", "" if config.out else "in the --policy folder"
    )
    if not config.out:
        data_file = config.data.prompts or config.data.pairs
        against = f"_vs_{Path(config.baseline).name or 'baseline'}" if config.baseline else ""
        name = f"eval_{data_stem(data_file)}{against}.json"
        refuse_replacing_other_result(
            path,
            {"prompts": str(config.data.prompts), "baseline": str(config.baseline or NO_BASELINE)},
            _earlier_eval_identity,
            "rlhf eval",
            path.with_name(name),
        )


NO_BASELINE = "(none)"  # the baseline of a result of --reward-fn alone, as the replacement check names it


def _earlier_eval_identity(earlier: dict) -> dict:
    """The prompts file and baseline of an earlier eval.json."""
    prompts = earlier.get("prompts")
    baseline = earlier.get("baseline")
    if baseline is None and "baseline" in earlier and earlier.get("reward_functions") is not None:
        return {"prompts": prompts, "baseline": NO_BASELINE}
    return {"prompts": prompts, "baseline": baseline.get("path") if isinstance(baseline, dict) else None}


def data_stem(path) -> str:
    """A data file's name without its suffixes (`eval_prompts.jsonl.gz` -> `eval_prompts`)."""
    name = Path(str(path)).name
    return name.split(".")[0] or "data"


def truncation_row(truncation: dict) -> str:
    """The summary's row of the prompts that lost turns or tokens to the budget."""
    share = truncation.get("prompts_truncated_share")
    return f"{truncation['prompts_truncated']}/{truncation['prompts']}" + (
        f" ({share:.1%})" if share is not None else ""
    )


def eval_system_prompt(config: EvalConfig) -> str:
    """data.system_prompt, else the --policy run's (its config.yaml), else "template"."""
    if config.data.system_prompt is not None:
        return config.data.system_prompt
    recorded = recorded_data_settings(config.policy).get("system_prompt")
    return recorded if recorded in ("template", "none") else "template"


def _rate(value, interval) -> str:
    if value is None:
        return "-"
    return f"{value:.3f} [{interval[0]:.3f}, {interval[1]:.3f}]"


def length_summary(length: dict) -> dict:
    """The summary's rows of `judge_length_bias`'s figures."""
    lc, matched = length["length_controlled"], length["length_matched"]
    coef = lc["length_coef"]
    interval = lc["length_coef_ci95"]
    return {
        "mean length (words)": "-"
        if length["policy_mean_length"] is None
        else f"{length['policy_mean_length']:.1f} policy / {length['baseline_mean_length']:.1f} baseline",
        "length-controlled win rate": _rate(lc["win_rate"], lc["win_rate_ci95"]) + " (bootstrap 95%)",
        "length coefficient": "-"
        if coef is None
        else f"{coef:+.3f}" + (f" [{interval[0]:+.3f}, {interval[1]:+.3f}]" if interval else ""),
        f"win rate, |length diff| <= {matched['tolerance']} words": _rate(
            matched["win_rate"], matched["win_rate_ci95"]
        )
        + f" (n={matched['n']}, Wilson 95%)",
    }


DEFAULT_EVAL_PROMPT_TOKENS = 512  # for a --policy that records no budget (a model from elsewhere)


def eval_prompt_budget(config: EvalConfig) -> int:
    """`rlhf eval`'s prompt budget: data.max_prompt_tokens, else the budget the --policy run was
    trained with (its config.yaml), so that both policies and the judge see the prompts they were
    trained on."""
    if config.data.max_prompt_tokens is not None:
        return config.data.max_prompt_tokens
    recorded = recorded_data_settings(config.policy).get("max_prompt_tokens")
    if isinstance(recorded, int) and not isinstance(recorded, bool) and recorded >= 1:
        return recorded
    return DEFAULT_EVAL_PROMPT_TOKENS


def _load_judge(
    spec: str,
    tokenizer,
    prompts_path: str,
    n: int,
    skip_invalid: bool = False,
    precision: Precision | None = None,
):
    """`judge_factory(start, end)`: a reward-model directory, or `world:DIR` for a built-in world's gold reward."""
    if spec.startswith("world:"):
        from rlhf.data.tokenize import render_prompt
        from rlhf.evaluation.judging import text_judge
        from rlhf.worlds import load_world

        world = load_world(spec[len("world:") :])
        texts = [
            render_prompt(tokenizer, ex.prompt)
            for ex in load_examples(prompts_path, kind="prompt", skip_invalid=skip_invalid).examples
        ][:n]
        return lambda start, end: text_judge(world.gold_rewards, texts[start:end])
    from rlhf.models.scalar_head import ScalarHeadModel

    reward_model = ScalarHeadModel.from_pretrained(spec)
    if precision is not None:
        precision.prepare(reward_model)
    judge = reward_model_judge(reward_model, precision=precision)
    return lambda start, end: judge
