#!/usr/bin/env bash
# SmolLM2-135M-Instruct + HH-RLHF (harmless-base) on a CPU: SFT -> DPO -> reward model (judge 1) ->
# PPO-max with a LoRA policy -> a second reward model on disjoint pairs (judge 2) -> held-out RM
# accuracy of both -> win rates PPO vs SFT, DPO vs SFT, PPO vs DPO under both judges and by held-out
# human labels -> reports.
# Only the `rlhf` CLI. examples/smollm2_hh/README.md gives the measured figures and the GPU command.
#
#   bash examples/smollm2_hh/run.sh                   # everything into runs/smollm2_hh
#   OUT=runs/hh MODEL=SMOLLM2_DIR bash examples/smollm2_hh/run.sh
#
# A stage whose output exists is skipped, so an interrupted run continues where it stopped.
# Each stage's wall time and peak RSS go to $OUT/logs/<stage>.time (GNU time -v, when installed).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
DATA="${DATA:-$HERE/data/harmless-base-test-first1500.jsonl.gz}"  # HH .jsonl(.gz), MIT (data/LICENSE)
MODEL="${MODEL:-HuggingFaceTB/SmolLM2-135M-Instruct}"  # hub id, HF directory, or GGUF dir + GGUF_FILE
GGUF_FILE="${GGUF_FILE:-}"                   # e.g. smollm2-135m-instruct.gguf inside $MODEL (README.md)
OUT="${OUT:-runs/smollm2_hh}"
RLHF="${RLHF:-rlhf}"                         # e.g. RLHF="python -m rlhf.cli" from a checkout
# sizes (README.md, "Why these budgets"): one epoch of every supervised stage, PPO-max until its KL
# to SFT is clearly above 0; about an hour of 2 idle CPU cores
PROMPT_TOKENS="${PROMPT_TOKENS:-96}"        # prompt budget of every stage (oldest turns dropped first)
SYSTEM_PROMPT="${SYSTEM_PROMPT:-none}"      # none: drop SmolLM2's default system prompt (~20 tokens)
RESPONSE_TOKENS="${RESPONSE_TOKENS:-32}"    # SFT / RM / DPO / held-out-pair response budget
SFT_EXAMPLES="${SFT_EXAMPLES:-200}"         # chosen responses SFT trains on (prepare.py --sft)
EPOCHS="${EPOCHS:-1}"                       # passes of sft, rm, rm2 and dpo over their data (x 8 rows a step)
SFT_STEPS="${SFT_STEPS:-}"                  # optional: a fixed number of steps instead (x 8 examples)
RM_STEPS="${RM_STEPS:-}"                    # ... x 8 pairs, each judge
DPO_STEPS="${DPO_STEPS:-}"                  # ... x 8 pairs (the first judge's pairs)
DPO_LR="${DPO_LR:-5e-4}"                    # LoRA learning rate of DPO (constant after 2 warmup steps)
RM_HELDOUT="${RM_HELDOUT:-300}"             # held-out pairs scored by rm-eval and the label verdict (all)
RM_LORA="${RM_LORA:-false}"                 # judges fully fine-tuned (true: LoRA r 16 + a full value head, which
                                            # stays at chance here: README.md, "How many pairs the judge needs")
RM_LR="${RM_LR:-2e-5}"                      # judges' rate (with RM_LORA=true: 2e-4, 10x, as for every LoRA stage)
PPO_ITERATIONS="${PPO_ITERATIONS:-24}"      # x 8 prompts
PPO_VS_DPO="${PPO_VS_DPO:-false}"           # true: also compare PPO-max with DPO (one more eval, ~6 min)
EVAL_N="${EVAL_N:-100}"                     # held-out prompts of each win rate
EVAL_TOKENS="${EVAL_TOKENS:-32}"            # response budget of the win rates
EXTRA="${EXTRA:-}"                           # flags added to sft, rm, rm2, dpo and train (e.g. the GPU ones)
PPO_EXTRA="${PPO_EXTRA:-}"                   # flags added to train only
UNTIL="${UNTIL:-}"                           # stop after this stage (prepare|sft|rm|...|eval-dpo-sft)
ONLY="${ONLY:-}"                             # run only these stages (e.g. ONLY="rm2 rm2-eval" beside a run)
export TOKENIZERS_PARALLELISM=false

mkdir -p "$OUT/logs"
gguf=()
[ -n "$GGUF_FILE" ] && gguf=(--gguf_file "$GGUF_FILE")

# shellcheck source=../lib/stages.sh
source "$HERE/../lib/stages.sh"  # stage NAME DONE_FILE CMD...

# 1. data: held-out RM pairs and eval prompts share no prompt with training, and judge 2's pairs
#    none with judge 1's (fixed seed)
stage prepare "$OUT/data/split.json" python "$HERE/prepare.py" --data "$DATA" --out "$OUT/data" --sft "$SFT_EXAMPLES"

steps() {  # steps N: a fixed step count when N is set, else $EPOCHS epochs
  if [ -n "$1" ]; then echo "--train.max_steps $1"; else echo "--train.epochs $EPOCHS"; fi
}
budgets=(--data.max_prompt_tokens "$PROMPT_TOKENS" --data.max_response_tokens "$RESPONSE_TOKENS"
  --data.system_prompt "$SYSTEM_PROMPT" --data.test_fraction 0.02)

# 2. SFT on the chosen responses (the chat template of SmolLM2-Instruct is applied: chat_template auto)
stage sft "$OUT/sft/model.safetensors" $RLHF sft --model "$MODEL" "${gguf[@]}" --data "$OUT/data/sft.jsonl" \
  --out "$OUT/sft" $(steps "$SFT_STEPS") --train.batch_size 8 --train.micro_batch_size 8 "${budgets[@]}" \
  --optim.lr 2e-5 --optim.warmup_steps 2 --train.log_every 1 --train.eval_every 1000 $EXTRA

# 3. DPO from the SFT model on judge 1's pairs, with a LoRA adapter as PPO's policy (its reference is
#    the adapter switched off); beta 0.1 (DPO paper, docs/algorithms.md §32); at PPO's LoRA rate (1e-4,
#    decaying) 12 steps left the implicit rewards at ~0.01 (README.md), hence 5e-4, constant
#    (one epoch of it reached 0.73 held-out accuracy on a GPU, README.md);
#    the reference scores each step's pairs (one epoch scores each pair once, as a cache would)
stage dpo "$OUT/dpo/model.safetensors" $RLHF dpo --model "$OUT/sft" --data "$OUT/data/rm_train.jsonl" \
  --out "$OUT/dpo" $(steps "$DPO_STEPS") --train.batch_size 8 --train.micro_batch_size 8 "${budgets[@]}" \
  --lora.enabled true --lora.r 16 --lora.alpha 32 --optim.lr "$DPO_LR" --optim.schedule constant \
  --optim.warmup_steps 2 --optim.warmup_fraction 0 \
  --dpo.beta 0.1 --dpo.precompute_reference false --train.log_every 1 --train.eval_every 1000 $EXTRA

# 4. reward models from the SFT model (ranking loss + LM loss on the chosen, PPO paper §4): judge 1,
#    which PPO optimizes, and judge 2 on disjoint pairs, which neither PPO nor DPO was trained against
rm_lora=(--lora.enabled "$RM_LORA")
[ "$RM_LORA" = true ] && rm_lora+=(--lora.r 16 --lora.alpha 32)
rm_stage() {  # rm_stage NAME PAIRS
  stage "$1" "$OUT/$1/model.safetensors" $RLHF rm --model "$OUT/sft" --data "$OUT/data/$2" \
    --out "$OUT/$1" $(steps "$RM_STEPS") --train.batch_size 8 --train.micro_batch_size 8 "${budgets[@]}" \
    "${rm_lora[@]}" --optim.lr "$RM_LR" --optim.warmup_steps 3 --optim.warmup_fraction 0 --train.log_every 1 --train.eval_every 1000 $EXTRA
}
rm_stage rm rm_train.jsonl

# 5. PPO-max with a LoRA policy (ppo.yaml: the settings under which the policy moves on a CPU)
stage ppo "$OUT/ppo/model.safetensors" $RLHF train --preset ppo_max --config "$HERE/ppo.yaml" \
  --policy "$OUT/sft" --reward-model "$OUT/rm" --prompts "$OUT/data/ppo_prompts.jsonl" --out "$OUT/ppo" \
  --train.iterations "$PPO_ITERATIONS" --data.max_prompt_tokens "$PROMPT_TOKENS" \
  --data.system_prompt "$SYSTEM_PROMPT" $EXTRA $PPO_EXTRA

# 6. judge 2, and both judges' accuracy on the same held-out pairs
rm_stage rm2 rm2_train.jsonl
# (Wilson interval in rm_eval.json); a few HH rows whose two dialogues differ before the last
# Assistant turn are no pair: skipped and counted
stage rm-eval "$OUT/rm/rm_eval.json" $RLHF rm-eval --reward-model "$OUT/rm" --data "$OUT/data/rm_heldout.jsonl" \
  --n "$RM_HELDOUT" --skip-invalid
stage rm2-eval "$OUT/rm2/rm_eval.json" $RLHF rm-eval --reward-model "$OUT/rm2" --data "$OUT/data/rm_heldout.jsonl" \
  --n "$RM_HELDOUT" --skip-invalid

# 7. win rates on held-out prompts, the same answers scored by both judges, and the verdict of held-out
#    human labels on the held-out pairs (no judge: did the policy raise the chosen response's
#    log-ratio to the baseline above the rejected one's; docs/algorithms.md §38)
win_rate() {  # win_rate NAME POLICY BASELINE OUT_FILE
  stage "$1" "$4" $RLHF eval --policy "$OUT/$2" --baseline "$OUT/$3" --judge "$OUT/rm" --judge "$OUT/rm2" \
    --prompts "$OUT/data/eval_prompts.jsonl" --n "$EVAL_N" --max-new-tokens "$EVAL_TOKENS" --seed 0 \
    --pairs "$OUT/data/rm_heldout.jsonl" --pairs-n "$RM_HELDOUT" --data.max_response_tokens "$RESPONSE_TOKENS" \
    --skip-invalid --out "$4"
}
win_rate eval-ppo-sft ppo sft "$OUT/ppo/eval.json"
win_rate eval-dpo-sft dpo sft "$OUT/dpo/eval.json"
[ "$PPO_VS_DPO" = true ] && win_rate eval-ppo-dpo ppo dpo "$OUT/ppo/eval_vs_dpo.json"

# 8. one report.html per stage, and every figure in one JSON
[ -n "$ONLY" ] && exit 0  # a run of some stages only: the whole run reports
for run in sft rm rm2 dpo ppo; do $RLHF report "$OUT/$run"; done
python "$HERE/summarize.py" "$OUT"
