#!/usr/bin/env bash
# The tool agent's demo (examples/tool_agent/README.md): a tiny chat policy warm-started to call a
# calculator tool now and then, GRPO on the episodes of an `openai`-client agent, held-out accuracy
# of the same agent against each policy served as an OpenAI-compatible endpoint, before and after.
#   bash examples/tool_agent/run.sh            # into runs/tool_agent (OUT=... to change)
set -euo pipefail
OUT=${OUT:-runs/tool_agent}
HERE=$(dirname "$0")
python "$HERE/prepare.py" --out "$OUT"
PYTHONPATH="$HERE${PYTHONPATH:+:$PYTHONPATH}" rlhf train --preset grpo --policy "$OUT/sft" \
    --prompts "$OUT/train.jsonl" --agent calculator_agent:solve \
    --config "$HERE/grpo.yaml" --out "$OUT/grpo"
python "$HERE/evaluate.py" "$OUT/sft" "$OUT/grpo" --prompts "$OUT/heldout.jsonl" --out "$OUT/heldout.json"
