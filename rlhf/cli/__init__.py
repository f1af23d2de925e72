"""The `rlhf` command. Each stage's body lives in rlhf/stages/ (or rlhf/demo/); this package parses,
opens the run (rlhf/rundir/open_run.py) and dispatches.

    rlhf sft   --model MODEL_DIR --data sft.jsonl --out runs/sft
    rlhf rm    --model runs/sft --data pairs.jsonl --out runs/rm
    rlhf dpo   --model runs/sft --data pairs.jsonl --out runs/dpo [--checkpoint.every 100]
    rlhf dpo   --resume runs/dpo
    rlhf train --preset ppo_max --policy runs/sft --reward-model runs/rm --prompts prompts.jsonl --out runs/ppo
    rlhf train --resume runs/ppo
    rlhf eval  --policy runs/ppo --baseline runs/sft --judge runs/rm --prompts test.jsonl
    rlhf eval  --policy runs/ppo --baseline runs/sft --pairs test_pairs.jsonl
    rlhf eval  --policy runs/grpo --reward-fn rlhf.rl.verifiers:numeric_answer --prompts test.jsonl
    rlhf rm-eval --reward-model runs/rm --data test_pairs.jsonl
    rlhf serve-rm --reward-model runs/rm --port 8000    # then: rlhf train ... --reward-url http://127.0.0.1:8000

Every stage also takes `--config FILE.yaml` and dotted overrides of any config field
(`--train.iterations 20`, `--kl.beta 0.05`, `--seed 1`); a named flag (`--policy`, `--n`) sets the
config key it names (rlhf/config/).

Model directories are data: their Python code never runs and their pickle weights are never read
unless `--trust-remote-code` / `--allow-pickle` say so (rlhf/models/trust.py).

    dispatch.py     main(): parse, the model-loading policy, the stage's command
    errors.py       the one error path: a message and an exit code for every failure
    parser.py       the parser, one sub-command per module below
    flags.py        the flag tables, the flags' value types, named flags under dotted overrides
    supervised.py   sft, rm, dpo      train.py    train          eval.py     eval
    rm_eval.py      rm-eval           demo.py     demo, ablate   plan.py     plan
    serve_rm.py     serve-rm          report.py   report         inspection.py  data check, config
"""

from rlhf.cli.dispatch import main
from rlhf.cli.eval import eval_config
from rlhf.cli.parser import STAGES, build_parser
from rlhf.cli.rm_eval import rm_eval_config

__all__ = ["STAGES", "build_parser", "eval_config", "main", "rm_eval_config"]
