#!/usr/bin/env bash
# The device check of a session lent a GPU, in one call (about 6 minutes on an H100/H200):
#   PYTHONPATH=. OUT=DIR bash bench/tools/gpu_check.sh
# 1. tests/gpu; 2. `rlhf train` under a one-rank torchrun with fsdp2 in bf16 from model directories;
# 3. `rlhf dpo` in bf16; 4. bench/speed/gpu.py's PPO iteration (small workloads, float32 and bf16);
# 5. peak GPU memory per phase of PPO-max (bench/memory/gpu_memory.py: the 84M workload and SmolLM2's
#    shape) and `rlhf plan` for the measured shapes. Functional checks first: what a cut-off run
#    leaves in $OUT is the most useful part. GPU_CHECK_QUICK=1 skips the timing
# cases and the float32 memory runs. Every figure lands in $OUT (gpu_tests.log, bench_gpu.jsonl,
# gpu_memory.jsonl, torchrun.log, dpo.log).
set -u
export PYTHONPATH=${PYTHONPATH:-.} PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
step() { echo; echo "== $* ($(date +%T))"; }

step versions
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
python3 -c "import torch, transformers, peft; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__, 'peft', peft.__version__)"

step "tests/gpu"
PT_TIMEOUT=$(python3 -c "import pytest_timeout" 2>/dev/null && echo "--timeout 120")
timeout 240 python3 -m pytest tests/gpu -m gpu -q -ra -p no:cacheprovider $PT_TIMEOUT \
    --junitxml "$OUT/gpu_tests.xml" >"$OUT/gpu_tests.log" 2>&1
echo "pytest exit $?"
grep -E "passed|failed|error" "$OUT/gpu_tests.log" | tail -3
grep -E "^(FAILED|ERROR)" "$OUT/gpu_tests.log" | head -30

QUICK=${GPU_CHECK_QUICK:-0}  # 1: skip the timing cases and the float32 memory runs (a rerun)
step "torchrun 1 rank, fsdp2, bf16: rlhf train from model directories"
MODELS=$(mktemp -d)
timeout 60 python3 -m bench.memory.gpu_models --workload m84 --out "$MODELS"
timeout 150 python3 -m torch.distributed.run --nproc-per-node 1 -m rlhf train --dist.strategy fsdp2 --preset ppo_max \
    --policy "$MODELS/policy" --reward-model "$MODELS/rm" --prompts "$MODELS/prompts.jsonl" \
    --out "$MODELS/ppo" --train.device cuda --dtype bfloat16 --train.iterations 2 \
    --rollout.batch_size 8 --rollout.max_new_tokens 8 --train.minibatches 2 \
    --critic.pretrain_iterations 1 >"$OUT/torchrun.log" 2>&1
echo "torchrun exit $?"
tail -25 "$OUT/torchrun.log"
ls "$MODELS/ppo"

step "rlhf dpo in bf16 from the same policy directory"
python3 - "$MODELS" <<'PY'
import json, random, sys
words = [w for w in open(sys.argv[1] + "/prompts.jsonl").read().split() if w.isalpha()][:200]
rng = random.Random(0)
with open(sys.argv[1] + "/pairs.jsonl", "w") as f:
    for _ in range(64):
        p, c, r = (" ".join(rng.choices(words, k=k)) for k in (6, 4, 4))
        f.write(json.dumps({"prompt": p, "chosen": c, "rejected": r}) + "\n")
PY
timeout 120 python3 -m rlhf dpo --model "$MODELS/policy" --data "$MODELS/pairs.jsonl" --out "$MODELS/dpo" \
    --train.device cuda --dtype bfloat16 --train.max_steps 6 --train.batch_size 8 --train.micro_batch_size 4 \
    --train.eval_every 3 >"$OUT/dpo.log" 2>&1
echo "dpo exit $?"
tail -12 "$OUT/dpo.log"
if [ "$QUICK" != 1 ]; then
step "bench/speed/gpu.py: PPO iteration"
timeout 30 python3 -m bench.speed.gpu info | tail -1 | tee -a "$OUT/bench_gpu.jsonl"
for workload in small-1x1 small-4x4; do
    for dtype in float32 bfloat16; do
        timeout 60 python3 -m bench.speed.gpu ppo --workload $workload --dtype $dtype --device cuda --iters 4 \
            >"$OUT/last_case.log" 2>&1
        echo "$workload $dtype exit $?"
        tail -1 "$OUT/last_case.log" | tee -a "$OUT/bench_gpu.jsonl"
        tail -4 "$OUT/last_case.log" | grep -i error
    done
done

fi

step "bench/memory/gpu_memory.py: peak allocated per phase, PPO-max, against rlhf plan"
DTYPES="bfloat16 float32"; [ "$QUICK" = 1 ] && DTYPES=bfloat16
for workload in m84 smollm2; do
    for dtype in $DTYPES; do
        timeout 90 python3 -m bench.memory.gpu_memory --workload $workload --dtype $dtype --iters 2 \
            >"$OUT/last_case.log" 2>&1
        echo "$workload $dtype exit $?"
        tail -1 "$OUT/last_case.log" | tee -a "$OUT/gpu_memory.jsonl"
        tail -6 "$OUT/last_case.log" | grep -iE "error|Traceback" -A3
    done
done
python3 -m rlhf plan --model m84 --strategy none --gpus 1 --dtype bfloat16 --micro-batch 4 --rollout-batch 8 \
    --prompt-tokens 16 --response-tokens 8 --json | python3 -c "import json,sys; print('plan m84 MiB', json.load(sys.stdin)['per_rank_peak_bytes'] / 2**20)"
python3 -m rlhf plan --model smollm2-135m --strategy none --gpus 1 --dtype bfloat16 --micro-batch 4 --rollout-batch 8 \
    --prompt-tokens 16 --response-tokens 64 --json | python3 -c "import json,sys; print('plan smollm2 MiB', json.load(sys.stdin)['per_rank_peak_bytes'] / 2**20)"

step done
