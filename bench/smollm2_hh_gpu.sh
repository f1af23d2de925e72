#!/usr/bin/env bash
# The SmolLM2 + HH recipe (examples/smollm2_hh/run.sh) on one GPU, its independent stages side by
# side: sft; then rm, rm2 and dpo together; then ppo, rm-eval and rm2-eval; then the three win rates.
# Every stage is run.sh's own (ONLY=), so the figures are the recipe's.
#
#   MODEL=DIR GGUF_FILE=F.gguf HH_OUT=/tmp/hh RESULTS=$OUT/results.tgz bash bench/smollm2_hh_gpu.sh
#
# Sizes: one epoch of each judge's pairs and of DPO, 30 PPO iterations of 32 prompts (overridable
# like run.sh's). RESULTS: a .tgz of every stage's JSON and log, rewritten every 10 s, so a run cut
# off by a time limit still hands back what finished.
set -u
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export OUT="${HH_OUT:-/tmp/hh}" RLHF="${RLHF:-python3 -m rlhf}"
export EXTRA="${EXTRA:---train.device cuda}" PROMPT_TOKENS="${PROMPT_TOKENS:-192}"
export RESPONSE_TOKENS="${RESPONSE_TOKENS:-128}" SFT_STEPS="${SFT_STEPS:-50}" RM_STEPS="${RM_STEPS:-69}"
export DPO_STEPS="${DPO_STEPS:-69}" RM_HELDOUT="${RM_HELDOUT:-300}" PPO_ITERATIONS="${PPO_ITERATIONS:-30}"
export EVAL_N="${EVAL_N:-100}" EVAL_TOKENS="${EVAL_TOKENS:-64}"
export PPO_EXTRA="${PPO_EXTRA:---rollout.batch_size 32 --rollout.max_new_tokens 64 --train.minibatches 4 --critic.pretrain_iterations 4}"
RESULTS="${RESULTS:-$OUT.tgz}"
RUN="$HERE/examples/smollm2_hh/run.sh"
mkdir -p "$OUT/logs"
if ! command -v python >/dev/null; then  # run.sh calls `python`; a wrapper keeps python3's environment
  mkdir -p "$OUT/bin" && printf '#!/bin/sh\nexec python3 "$@"\n' >"$OUT/bin/python" && chmod +x "$OUT/bin/python"
  export PATH="$OUT/bin:$PATH"
fi

pack() {  # every small file of the run (JSON, logs, metrics), not the models
  (cd "$OUT" && find . \( -name '*.json' -o -name '*.jsonl' -o -name '*.log' -o -name '*.time' \
    -o -name '*.png' \) -size -4M -print0 | tar czf "$RESULTS.tmp" --null -T - && mv "$RESULTS.tmp" "$RESULTS")
}
(while sleep 10; do pack; done) &
packer=$!

together() {  # together STAGE...: run.sh's stages at once, each in its own process
  local pids=() stage
  for stage in "$@"; do ONLY="$stage" bash "$RUN" >"$OUT/logs/driver-$stage.log" 2>&1 & pids+=($!); done
  for pid in "${pids[@]}"; do wait "$pid"; done
  echo "== $* done ($(date +%T))"
}

echo "== start ($(date +%T))"
UNTIL=sft bash "$RUN" >"$OUT/logs/driver-sft.log" 2>&1
echo "== prepare sft done ($(date +%T))"
together rm rm2 dpo
together ppo rm-eval rm2-eval
together eval-ppo-dpo eval-ppo-sft eval-dpo-sft
for run in sft rm rm2 dpo ppo; do $RLHF report "$OUT/$run" >/dev/null 2>&1; done
python3 "$HERE/examples/smollm2_hh/summarize.py" "$OUT" >"$OUT/logs/summarize.log" 2>&1
echo "== summarize exit $? ($(date +%T))"
kill "$packer" 2>/dev/null
pack
tail -30 "$OUT/logs/summarize.log"
