#!/usr/bin/env bash
# SmolLM2-135M-Instruct + HH-RLHF (harmless-base) on a CPU: SFT -> reward model -> held-out RM
# accuracy -> PPO-max with a LoRA policy -> win rate against SFT -> reports. Only the `rlhf` CLI.
# examples/smollm2_hh/README.md gives the measured figures and the GPU command.
#
#   bash examples/smollm2_hh/run.sh                   # everything into runs/smollm2_hh
#   OUT=/tmp/hh MODEL=/path/to/smollm2 bash examples/smollm2_hh/run.sh
#
# A stage whose output exists is skipped, so an interrupted run continues where it stopped.
# Each stage's wall time and peak RSS go to $OUT/logs/<stage>.time (GNU time -v, when installed).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
DATA="${DATA:-/work/shared/data/hh-rlhf/harmless-base-test-first1500.jsonl.gz}"  # HH .jsonl(.gz)
MODEL="${MODEL:-/work/models/smollm2-f32}"  # SmolLM2-135M-Instruct (HF directory, or GGUF dir + GGUF_FILE)
GGUF_FILE="${GGUF_FILE:-}"                   # e.g. smollm2-135m-instruct.gguf inside $MODEL
OUT="${OUT:-runs/smollm2_hh}"
RLHF="${RLHF:-rlhf}"                         # e.g. RLHF="python -m rlhf.cli" from a checkout
# sizes (README.md: the measured run used smaller ones on a loaded machine)
PROMPT_TOKENS="${PROMPT_TOKENS:-64}"        # prompt budget of every stage (oldest turns dropped first)
RESPONSE_TOKENS="${RESPONSE_TOKENS:-32}"    # SFT / RM response budget
SFT_STEPS="${SFT_STEPS:-24}"                # x 8 examples
RM_STEPS="${RM_STEPS:-80}"                  # x 8 pairs
RM_HELDOUT="${RM_HELDOUT:-300}"             # held-out pairs scored by rm-eval
PPO_ITERATIONS="${PPO_ITERATIONS:-30}"      # x 8 prompts
EVAL_N="${EVAL_N:-100}"                     # held-out prompts of the win rate
EXTRA="${EXTRA:-}"                           # flags added to sft, rm and train (e.g. the GPU ones)
PPO_EXTRA="${PPO_EXTRA:-}"                   # flags added to train only
UNTIL="${UNTIL:-}"                           # stop after this stage (prepare|sft|rm|rm-eval|ppo|eval)
export TOKENIZERS_PARALLELISM=false

mkdir -p "$OUT/logs"
gguf=()
[ -n "$GGUF_FILE" ] && gguf=(--gguf_file "$GGUF_FILE")

stage() {  # stage NAME DONE_FILE CMD...: run CMD unless DONE_FILE exists; time it
  local name="$1" done_file="$2"
  shift 2
  if [ -e "$done_file" ]; then
    echo "== $name: done ($done_file)"
    if [ "$name" = "$UNTIL" ]; then exit 0; fi
    return
  fi
  echo "== $name: $*"
  if [ -x /usr/bin/time ]; then
    /usr/bin/time -v -o "$OUT/logs/$name.time" "$@" 2>&1 | tee "$OUT/logs/$name.log"
  else
    "$@" 2>&1 | tee "$OUT/logs/$name.log"
  fi
  if [ "$name" = "$UNTIL" ]; then echo "== stopping after $name (UNTIL)"; exit 0; fi
}

# 1. data: held-out RM pairs and eval prompts share no prompt with training (fixed seed)
stage prepare "$OUT/data/split.json" python "$HERE/prepare.py" --data "$DATA" --out "$OUT/data"

# 2. SFT on the chosen responses (the chat template of SmolLM2-Instruct is applied: chat_template auto)
stage sft "$OUT/sft/model.safetensors" $RLHF sft --model "$MODEL" "${gguf[@]}" --data "$OUT/data/sft.jsonl" \
  --out "$OUT/sft" --train.max_steps "$SFT_STEPS" --train.batch_size 8 --train.micro_batch_size 8 \
  --data.max_prompt_tokens "$PROMPT_TOKENS" --data.max_response_tokens "$RESPONSE_TOKENS" --data.test_fraction 0.02 \
  --optim.lr 2e-5 --optim.warmup_steps 2 --train.log_every 1 --train.eval_every 1000 $EXTRA

# 3. reward model from the SFT model (ranking loss + LM loss on the chosen, PPO paper §4)
stage rm "$OUT/rm/model.safetensors" $RLHF rm --model "$OUT/sft" --data "$OUT/data/rm_train.jsonl" \
  --out "$OUT/rm" --train.max_steps "$RM_STEPS" --train.batch_size 8 --train.micro_batch_size 8 \
  --data.max_prompt_tokens "$PROMPT_TOKENS" --data.max_response_tokens "$RESPONSE_TOKENS" --data.test_fraction 0.02 \
  --optim.lr 2e-5 --optim.warmup_steps 3 --optim.warmup_fraction 0 --train.log_every 1 --train.eval_every 1000 $EXTRA

# 4. reward-model accuracy on the held-out pairs (Wilson interval in rm_eval.json); a few HH rows
#    whose two dialogues differ before the last Assistant turn are no pair: skipped and counted
stage rm-eval "$OUT/rm/rm_eval.json" $RLHF rm-eval --reward-model "$OUT/rm" --data "$OUT/data/rm_heldout.jsonl" \
  --n "$RM_HELDOUT" --skip-invalid

# 5. PPO-max with a LoRA policy (ppo.yaml: the settings under which the policy moves on a CPU)
stage ppo "$OUT/ppo/model.safetensors" $RLHF train --preset ppo_max --config "$HERE/ppo.yaml" \
  --policy "$OUT/sft" --reward-model "$OUT/rm" --prompts "$OUT/data/ppo_prompts.jsonl" --out "$OUT/ppo" \
  --train.iterations "$PPO_ITERATIONS" --data.max_prompt_tokens "$PROMPT_TOKENS" $EXTRA $PPO_EXTRA

# 6. win rate of PPO against SFT on held-out prompts, judged by the reward model
stage eval "$OUT/ppo/eval.json" $RLHF eval --policy "$OUT/ppo" --baseline "$OUT/sft" --judge "$OUT/rm" \
  --prompts "$OUT/data/eval_prompts.jsonl" --n "$EVAL_N" --max-new-tokens 48 --seed 0 --skip-invalid

# 7. one report.html per stage
for run in sft rm ppo; do $RLHF report "$OUT/$run"; done
python "$HERE/summarize.py" "$OUT"
