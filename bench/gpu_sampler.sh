#!/usr/bin/env bash
# The sampler's GPU check (issue 37), in one call (5-7 minutes expected on an H100/H200; its time
# limits keep it under 10, one device call; OUT=$OUT on the device machine):
#   PYTHONPATH=. OUT=DIR bash bench/gpu_sampler.sh            # SMOLLM2=DIR: the real model instead
# 1. tests/gpu/test_gpu_sampler_engines.py: the static and CUDA-graph engines draw the eager
#    engine's rollout (float32, bf16 autocast, bf16 weights, LoRA, batch of one);
# 2. bench/sampler.py on CUDA in bfloat16: new tokens/s of our engines (eager, static, cuda_graph)
#    against transformers' generate (dynamic cache, static cache, static cache + torch.compile) at
#    batch 1, 16 and 64 x 128 new tokens, then the issue's reference shape (32 prompts x 64 tokens);
#    SmolLM2-135M's shape with random weights unless SMOLLM2 names the converted model directory
#    (EOS is off: the work is the same). Targets: >= 20,000 new tokens/s at batch 64, and at least
#    generate's static cache.
# Every figure lands in $OUT (sampler_tests.log, sampler_cuda_bf16.json, sampler_cuda_32x64.json);
# the JSON is rewritten after each batch size, so a run cut off keeps what it measured.
set -u
export PYTHONPATH=${PYTHONPATH:-.} PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
OUT=${OUT:-/tmp/gpu_sampler}
mkdir -p "$OUT"
step() { echo; echo "== $* ($(date +%T))"; }
if [ -n "${SMOLLM2:-}" ]; then SOURCE=(--model "$SMOLLM2"); else SOURCE=(--shape smollm2); fi

step versions
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
python3 -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__)"

step "tests/gpu/test_gpu_sampler_engines.py"
timeout 120 python3 -m pytest tests/gpu/test_gpu_sampler_engines.py -m gpu -q -ra -p no:cacheprovider \
    >"$OUT/sampler_tests.log" 2>&1
echo "pytest exit $?"
tail -3 "$OUT/sampler_tests.log"
grep -E "^(FAILED|ERROR)|Error" "$OUT/sampler_tests.log" | head -20

step "bench/sampler.py: bf16, batch 1 16 64 x 128 new tokens"
timeout 330 python3 -m bench.sampler "${SOURCE[@]}" --device cuda --dtype bfloat16 --batch-sizes 64 16 1 \
    --new-tokens 128 --reps 2 --hf-compile --out "$OUT/sampler_cuda_bf16.json" >"$OUT/sampler_bench.log" 2>&1
echo "bench exit $?"
grep -E "rep [1-9]" "$OUT/sampler_bench.log" | tail -30
python3 - "$OUT/sampler_cuda_bf16.json" <<'PY'
import json, sys
result = json.load(open(sys.argv[1]))
for batch, row in result["batches"].items():
    print(batch, {k: v.get("tok_per_s", v.get("error")) for k, v in row.items() if isinstance(v, dict)})
PY

step "bench/sampler.py: the issue's shape, 32 prompts x 64 new tokens"
timeout 120 python3 -m bench.sampler "${SOURCE[@]}" --device cuda --dtype bfloat16 --batch-sizes 32 \
    --new-tokens 64 --reps 3 --out "$OUT/sampler_cuda_32x64.json" >"$OUT/sampler_32x64.log" 2>&1
echo "bench exit $?"
tail -1 "$OUT/sampler_32x64.log" | cut -c1-1500

step done
