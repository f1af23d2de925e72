#!/usr/bin/env bash
# SmolLM2-135M-Instruct on math word problems (SVAMP) on a CPU: SFT on the training split's equations as
# arithmetic ("56 * 9") -> GRPO (two seeds), DAPO and PPO-max from the same SFT model against the verifier
# that computes the answer's arithmetic (rlhf.rl.verifiers:expression_answer) alone -> greedy
# accuracy on the whole test split (1,000 SVAMP problems) of the SFT model and of each RL policy, with
# Wilson 95% intervals -> results.json. Only the `rlhf` CLI. examples/smollm2_math/README.md gives the
# measured figures.
#
#   bash examples/smollm2_math/run.sh                   # everything into runs/smollm2_math
#   MODEL=SMOLLM2_DIR GGUF_FILE=SmolLM2-135M-Instruct.Q4_1.gguf bash examples/smollm2_math/run.sh
#
# A stage whose output exists is skipped, so an interrupted run continues where it stopped.
# Each stage's wall time and peak RSS go to $OUT/logs/<stage>.time (GNU time -v, when installed).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
DATA="${DATA:-$HERE/data}"                   # train.jsonl.gz (MAWPS + ASDiv-A), test.jsonl.gz (SVAMP); MIT (data/LICENSE)
MODEL="${MODEL:-HuggingFaceTB/SmolLM2-135M-Instruct}"  # hub id, HF directory, or GGUF dir + GGUF_FILE
GGUF_FILE="${GGUF_FILE:-}"                   # e.g. SmolLM2-135M-Instruct.Q4_1.gguf inside $MODEL (README.md)
OUT="${OUT:-runs/smollm2_math}"
RLHF="${RLHF:-rlhf}"                         # e.g. RLHF="python -m rlhf.cli" from a checkout
PYTHON="${PYTHON:-python}"
VERIFIER="${VERIFIER:-rlhf.rl.verifiers:expression_answer}"  # 1 if the response's arithmetic has the answer's value
SFT_STEPS="${SFT_STEPS:-40}"                 # x 8 training problems
ITERATIONS="${ITERATIONS:-12}"              # RL iterations of every method (x 64 answers)
METHODS="${METHODS:-grpo dapo ppo_max}"      # each from the same SFT model, with its $HERE/<method>.yaml
SEEDS="${SEEDS:-0}"                          # e.g. SEEDS="0 1": every method once per seed
MORE_SEEDS="${MORE_SEEDS:-grpo:1}"           # method:seed runs beyond those (the best method's second seed)
EVAL_N="${EVAL_N:-1000}"                     # test problems evaluated (the first N; 1000: all of SVAMP)
EVAL_TOKENS="${EVAL_TOKENS:-16}"             # greedy answer budget of the evaluation (as in training)
EXTRA="${EXTRA:-}"                           # flags added to every train stage
UNTIL="${UNTIL:-}"                           # stop after this stage (prepare|sft|eval-sft|grpo-0|eval-grpo-0|...)
ONLY="${ONLY:-}"                             # run only these stages
export TOKENIZERS_PARALLELISM=false

mkdir -p "$OUT/logs"
gguf=()
[ -n "$GGUF_FILE" ] && gguf=(--gguf_file "$GGUF_FILE")

# shellcheck source=../lib/stages.sh
source "$HERE/../lib/stages.sh"  # stage NAME DONE_FILE CMD...

# 1. data: SFT examples and RL prompts from the training split, the test split's prompts
stage prepare "$OUT/data/test_prompts.jsonl" $PYTHON "$HERE/prepare.py" --data "$DATA" --out "$OUT/data"

# 2. SFT: the answer format "56 * 9" (the training split's equations, as arithmetic), 40 steps x 8 problems
stage sft "$OUT/sft/model.safetensors" $RLHF sft --model "$MODEL" "${gguf[@]}" --data "$OUT/data/sft.jsonl" \
  --out "$OUT/sft" --train.max_steps "$SFT_STEPS" --train.batch_size 8 --train.micro_batch_size 8 \
  --data.max_prompt_tokens 128 --data.max_response_tokens 32 --data.system_prompt none --data.test_fraction 0.02 \
  --optim.lr 5e-5 --optim.warmup_steps 3 --train.log_every 5 --train.eval_every 1000

evaluate() {  # evaluate NAME POLICY_DIR: greedy accuracy on the test split (eval_test.json)
  stage "eval-$1" "$2/eval_test.json" $RLHF eval --policy "$2" --reward-fn "$VERIFIER" \
    --prompts "$OUT/data/test_prompts.jsonl" --n "$EVAL_N" --temperature 0 --max-new-tokens "$EVAL_TOKENS" \
    --out "$2/eval_test.json"
}
evaluate sft "$OUT/sft"

# 3. every method from the SFT model, against the verifier alone (no reward model), then its accuracy
rl() {  # rl METHOD SEED: train from the SFT model, then evaluate
  stage "$1-$2" "$OUT/$1-$2/model.safetensors" $RLHF train --preset "$1" \
    --config "$HERE/$1.yaml" --policy "$OUT/sft" --prompts "$OUT/data/train_prompts.jsonl" \
    --reward-fn "$VERIFIER" --out "$OUT/$1-$2" --train.iterations "$ITERATIONS" --seed "$2" $EXTRA
  evaluate "$1-$2" "$OUT/$1-$2"
}
for seed in $SEEDS; do
  for method in $METHODS; do rl "$method" "$seed"; done
done
for run in $MORE_SEEDS; do rl "${run%%:*}" "${run##*:}"; done

# 4. every figure in one JSON
[ -n "$ONLY" ] && exit 0
$PYTHON "$HERE/summarize.py" "$OUT"
