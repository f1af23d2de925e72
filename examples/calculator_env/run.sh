#!/usr/bin/env bash
# The calculator environment's demo (examples/calculator_env/README.md): a tiny policy warm-started
# to call a calculator now and then, GRPO on calculator episodes, held-out accuracy before and after.
#   bash examples/calculator_env/run.sh            # into runs/calc (OUT=... to change)
set -euo pipefail
OUT=${OUT:-runs/calc}
HERE=$(dirname "$0")
python "$HERE/prepare.py" --out "$OUT"
rlhf train --preset grpo --policy "$OUT/sft" --prompts "$OUT/train.jsonl" \
    --env rlhf.envs.calculator:Calculator --env.max_turns 2 \
    --config "$HERE/grpo.yaml" --out "$OUT/grpo"
python "$HERE/evaluate.py" "$OUT/sft" "$OUT/grpo" --prompts "$OUT/heldout.jsonl" --out "$OUT/heldout.json"
