"""The `rlhf` command: this package parses, opens the run (rlhf/rundir/open_run.py) and dispatches;
each stage's body lives in rlhf/stages/ (or rlhf/demo/). Every command with examples: docs/usage.md.

    dispatch.py  main(): parse, the model-loading policy, the stage's command
    errors.py    the one error path: a message and an exit code for every failure
    parser.py    the parser; flags.py the flag tables and value types, named flags under dotted keys
    supervised.py sft, rm, dpo; train.py; eval.py; rm_eval.py; demo.py (demo, ablate); plan.py;
    serve_rm.py; report.py; inspection.py (data check, config)
Model directories are data: their code never runs and their pickle weights are never read unless
`--trust-remote-code` / `--allow-pickle` say so (rlhf/models/trust.py).
"""

from rlhf.cli.dispatch import main
from rlhf.cli.eval import eval_config
from rlhf.cli.parser import STAGES, build_parser
from rlhf.cli.rm_eval import rm_eval_config

__all__ = ["STAGES", "build_parser", "eval_config", "main", "rm_eval_config"]
