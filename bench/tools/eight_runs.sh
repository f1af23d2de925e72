#!/usr/bin/env bash
# The eight-run metric comparison: eight short `rlhf train` runs on the demo's
# SFT and reward models, to compare record by record across a refactor with bench/tools/compare_metrics.py.
#
#   bash bench/tools/eight_runs.sh REPO DEMO_DIR OUT_DIR     # REPO: the checkout whose code runs
#   for r in OUT_A/*/; do python bench/tools/compare_metrics.py $r/metrics.jsonl OUT_B/$(basename $r)/metrics.jsonl \
#       --ignore value/explained_variance critic_pretrain/explained_var; done
set -euo pipefail
REPO=$(cd "$1" && pwd); DEMO=$(cd "$2" && pwd); OUT=$3
PY=${PY:-$(dirname "$0")/../../.venv/bin/python}
PY=$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")
mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
COMMON=(--policy "$DEMO/sft" --reward-model "$DEMO/rm" --prompts "$DEMO/world/prompts_train.jsonl"
    --train.iterations 4 --rollout.batch_size 16 --rollout.max_new_tokens 16 --train.minibatches 2
    --train.micro_batch_size 4 --policy_optim.lr 1e-6 --critic_optim.lr 2e-6 --log.sinks jsonl)
run() {
    local name=$1; shift
    rm -rf "${OUT:?}/$name"
    (cd "$REPO" && "$PY" -m rlhf train "${COMMON[@]}" --out "$OUT/$name" "$@" >"$OUT/$name.log" 2>&1) \
        || { echo "$name failed: $OUT/$name.log"; return 1; }
    echo "$name done"
}
run ppo_max --preset ppo_max --critic.pretrain_iterations 2
run ppo_max_serial --preset ppo_max --critic.pretrain_iterations 2 --runtime.overlap_critic false \
    --runtime.split_forwards false
run shared_critic --preset ppo_max --critic.pretrain_iterations 2 --model.critic_mode shared
run lora --preset ppo_max --critic.pretrain_iterations 2 --model.lora.enabled true \
    --model.critic_lora.enabled true
run apa --preset apa --critic.pretrain_iterations 2
run awr_buffer2 --preset awr --critic.pretrain_iterations 2 --train.buffer_size 2
run vanilla_entropy --preset vanilla_ppo --critic.pretrain_iterations 2 --policy.entropy_coef 0.01
run ptx_sampler_logprobs --preset ppo_max --critic.pretrain_iterations 2 --data.ptx "$DEMO/world/sft_train.jsonl" \
    --policy.ptx_coef 0.1 --rollout.logprobs_from_sampler true
