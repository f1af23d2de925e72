#!/usr/bin/env bash
# The GPU speed figures (and the bf16 critic probe), in one device call, most valuable first
# (about 6-7 minutes on an H100/H200; each step has its own time limit, and each writes its figures
# to $OUT as it ends, so a run cut off keeps what it measured):
#   PYTHONPATH=. OUT=DIR bash bench/speed/gpu_speed.sh  [ASSETS=bench/.cache/gpu]
# 1. tests/gpu: every CUDA test (the sampler's static and CUDA-graph engines, packing, FSDP2, RL);
# 2. bench/speed/sampler.py in bf16: our engines (static, cuda_graph, compiled)
#    against transformers' generate (dynamic and static cache) at batch 64, 16, 1 x 128 new tokens,
#    then 32 x 64 (each compiled shape compiles once, in its warm-up round);
# 3. bench/speed/gpu.py ppo: one PPO iteration of 32 prompts x 64 tokens on SmolLM2-135M's shape with random
#    weights (EOS never stops a response: the trained model's work): bf16 1x1 with the graph engine, then
#    with the compiled one (auto's choice from a shape's third call) in bf16 and float32, 1x1 and 4x4;
# 4. bench/speed/packing.py: SFT tokens/s padded against packed, bf16, SmolLM2's config and tokenizer with
#    random weights, HH rows (ASSETS: smollm2/ holds config.json and the tokenizer, no weights;
#    hh_sft.jsonl; both from a recipe run, carried in bench/.cache/gpu, which git ignores);
# 5. bench/studies/critic_nan_gpu.py --shape smollm2: the bf16 critic per SDPA kernel;
# 6. generate with a static cache + torch.compile at batch 64 (compiles: last).
# 7. bench/speed/sampler_profile.py: where a graph-engine call's time goes (prefill, capture, steps; the
#    device's busy share), batch 64 and 1, cuda_graph and compiled;
# 8. bench/speed/update_profile.py: where the PPO update's time goes (smollm2-4x4, 32 x 64, bf16).
# 9. bench/speed/update_compile.py: the update with train.compile (the policy's and critic's decoders
#    compiled), against as is (the lever left for a PPO iteration under 0.7 s; smollm2-1x1, 32 x 64, bf16).
# STEPS="1 3 7" runs only those steps (a rerun); ENGINES, HF_CACHES (step 2), PPO_CASES ("workload
# dtype engine [compile]", comma-separated: step 3; "compile" adds train.compile), PROFILE_ENGINES, PROFILE_BATCHES (step 7) and
# TESTS_TIMEOUT (step 1) narrow a step to what is new (docs/speed.md "On a GPU").
# DEVICE=cpu SMALL=1 runs the same steps at toy sizes on a CPU (a check of this script itself).
set -u
export PYTHONPATH=${PYTHONPATH:-.} PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
OUT=${OUT:-/tmp/gpu_speed}
ASSETS=${ASSETS:-bench/.cache/gpu}
DEVICE=${DEVICE:-cuda}
SMALL=${SMALL:-0}
PY=${PY:-python3}
mkdir -p "$OUT"
STEPS=${STEPS:-1 2 3 4 5 6 7 8 9}
step() { echo; echo "== $* ($(date +%T))"; }
want() { case " $STEPS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
if [ "$SMALL" = 1 ]; then
    BATCHES="4 1" NEW=8 B=4 L=8 ITERS=2 ROWS=4 MICRO=2 MAXTOK=64 PSTEPS=1 CROWS=4 CSTEPS=1 REPS=1
else
    BATCHES="64 16 1" NEW=128 B=32 L=64 ITERS=4 ROWS=32 MICRO=8 MAXTOK=256 PSTEPS=4 CROWS=32 CSTEPS=6 REPS=2
fi

step versions
[ "$DEVICE" = cuda ] && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
$PY -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__)"

if want 1 && [ "$DEVICE" = cuda ]; then
    step "1. tests/gpu"
    timeout ${TESTS_TIMEOUT:-170} $PY -m pytest tests/gpu -m gpu -q -ra -p no:cacheprovider --durations 8 \
        >"$OUT/gpu_tests.log" 2>&1
    echo "pytest exit $?"
    grep -E "passed|failed|error" "$OUT/gpu_tests.log" | tail -2
    grep -E "^(FAILED|ERROR)" "$OUT/gpu_tests.log" | head -20
    grep -B2 -A25 -m1 "^_____" "$OUT/gpu_tests.log" | cut -c1-220 | head -60
fi

if want 2; then
step "2. bench/speed/sampler.py bf16: batch $BATCHES x $NEW new tokens"
DTYPE=bfloat16
DEFAULT_ENGINES="static cuda_graph compiled"; [ "$DEVICE" = cuda ] || DEFAULT_ENGINES="eager static compiled"
ENGINES=${ENGINES:-$DEFAULT_ENGINES}
HF_CACHES=${HF_CACHES:-dynamic static}
timeout 300 $PY -m bench.speed.sampler --shape smollm2 --device "$DEVICE" --dtype $DTYPE --batch-sizes $BATCHES \
    --new-tokens $NEW --reps $REPS --engines $ENGINES --hf-caches $HF_CACHES --out "$OUT/sampler_bf16.json" >"$OUT/sampler_bench.log" 2>&1
echo "sampler exit $?"
tail -4 "$OUT/sampler_bench.log" | grep -iE "error|Traceback" -A3
timeout 120 $PY -m bench.speed.sampler --shape smollm2 --device "$DEVICE" --dtype $DTYPE --batch-sizes $B \
    --new-tokens $L --reps 3 --engines $ENGINES --hf-caches $HF_CACHES --out "$OUT/sampler_bf16_32x64.json" >"$OUT/sampler_32x64.log" 2>&1
echo "sampler $B x $L exit $?"
$PY - "$OUT"/sampler_bf16.json "$OUT"/sampler_bf16_32x64.json <<'PY'
import json, sys
for path in sys.argv[1:]:
    try:
        result = json.load(open(path))
    except (OSError, ValueError) as error:
        print(path, "missing:", error)
        continue
    for batch, row in result["batches"].items():
        print("batch", batch, {k: v.get("tok_per_s", v.get("error")) for k, v in row.items() if isinstance(v, dict)})
PY
fi

if want 3; then
step "3. bench/speed/gpu.py ppo: $B prompts x $L tokens, SmolLM2 shape"
COMPILED=compiled; [ "$DEVICE" = cuda ] || COMPILED=static
# auto would compile in a counted iteration (from a shape's third call on): the engines are named
GRAPH=cuda_graph; [ "$DEVICE" = cuda ] || GRAPH=static
PPO_CASES=${PPO_CASES:-"smollm2-1x1 bfloat16 $GRAPH,smollm2-1x1 bfloat16 $COMPILED,smollm2-1x1 float32 $COMPILED,smollm2-4x4 bfloat16 $COMPILED"}
IFS=, read -ra CASES <<<"$PPO_CASES"
for case in "${CASES[@]}"; do
    set -- $case
    # a fourth word "compile": train.compile, whose first iteration compiles (2 not counted)
    if [ "${4:-}" = compile ]; then EXTRA="--compile --warmup 2" N=$((ITERS + 1)); else EXTRA="" N=$ITERS; fi
    timeout 200 $PY -m bench.speed.gpu ppo --workload "$1" --dtype "$2" --engine "$3" --device "$DEVICE" --iters $N \
        --batch-size $B --response-length $L $EXTRA >"$OUT/last_ppo.log" 2>&1
    echo "$1 $2 $3 ${4:-} exit $?"
    tail -1 "$OUT/last_ppo.log" | tee -a "$OUT/ppo_iteration.jsonl" | cut -c1-400
    tail -5 "$OUT/last_ppo.log" | grep -iE "error|Traceback" -A3
done
fi

if want 4; then
step "4. bench/speed/packing.py: SFT padded vs packed, bf16"
MODEL=$(mktemp -d)/smollm2  # the carried config and tokenizer, and random weights saved beside them
cp -r "$ASSETS/smollm2" "$MODEL"
timeout 60 $PY - "$MODEL" <<'PY'
import sys, torch
from transformers import AutoConfig, AutoModelForCausalLM
config = AutoConfig.from_pretrained(sys.argv[1])
torch.manual_seed(0)
AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(sys.argv[1])
print("random weights saved")
PY
timeout 120 $PY -m bench.speed.packing --model "$MODEL" --data "$ASSETS/hh_sft.jsonl" --device "$DEVICE" \
    --dtype $DTYPE --rows $ROWS --micro $MICRO --max_tokens $MAXTOK --steps $PSTEPS --rounds 3 \
    --out "$OUT/packing_sft_bf16.json" >"$OUT/packing.log" 2>&1
echo "packing exit $?"
$PY -c "import json,sys; r=json.load(open(sys.argv[1])); print({k: r[k] for k in ('tokens_per_s_best', 'speedup_best', 'padded_share', 'nll_sum')})" "$OUT/packing_sft_bf16.json"
tail -4 "$OUT/packing.log" | grep -iE "error|Traceback" -A3
fi

if want 5; then
step "5. bench/studies/critic_nan_gpu.py --shape smollm2"
timeout 90 $PY -m bench.studies.critic_nan_gpu --shape smollm2 --rows $CROWS --steps $CSTEPS \
    >"$OUT/critic_nan.jsonl" 2>"$OUT/critic_nan.log"
echo "critic probe exit $?"
tail -1 "$OUT/critic_nan.jsonl"
tail -3 "$OUT/critic_nan.log" | grep -iE "error|Traceback" -A3
fi

if want 6; then
step "6. generate: static cache + torch.compile, batch ${BATCHES%% *}"
timeout 120 $PY -m bench.speed.sampler --shape smollm2 --device "$DEVICE" --dtype $DTYPE --batch-sizes ${BATCHES%% *} \
    --new-tokens $NEW --reps $REPS --engines cuda_graph --hf-caches static --hf-compile \
    --out "$OUT/sampler_bf16_compile.json" >"$OUT/sampler_compile.log" 2>&1
echo "compile exit $?"
tail -1 "$OUT/sampler_compile.log" | cut -c1-800
fi

if want 7; then
step "7. bench/speed/sampler_profile.py: one call of the cuda_graph and compiled engines, batch ${BATCHES%% *} and 1"
for engine in ${PROFILE_ENGINES:-cuda_graph compiled}; do
    for batch in ${PROFILE_BATCHES:-${BATCHES%% *} 1}; do
        ENGINE=$engine; [ "$DEVICE" = cuda ] || ENGINE=static
        timeout 150 $PY -m bench.speed.sampler_profile --device "$DEVICE" --dtype bfloat16 --engine $ENGINE --batch $batch \
            --new-tokens $NEW >"$OUT/sampler_profile_${engine}_$batch.log" 2>&1
        echo "profile $engine batch $batch exit $?"
        tail -1 "$OUT/sampler_profile_${engine}_$batch.log"
    done
done
fi

if want 8; then
step "8. bench/speed/update_profile.py: the PPO update, smollm2-4x4, $B x $L, bf16"
timeout 150 $PY -m bench.speed.update_profile --workload smollm2-4x4 --batch-size $B --response-length $L \
    --device "$DEVICE" --dtype bfloat16 >"$OUT/update_profile.log" 2>&1
echo "update profile exit $?"
tail -1 "$OUT/update_profile.log" | cut -c1-1500
fi

if want 9; then
step "9. bench/speed/update_compile.py: the PPO update with compiled decoders, smollm2-1x1, $B x $L, bf16"
timeout 300 $PY -m bench.speed.update_compile --workload smollm2-1x1 --batch-size $B --response-length $L \
    --device "$DEVICE" --dtype bfloat16 --iters $((ITERS + 1)) >"$OUT/update_compile.log" 2>&1
echo "update compile exit $?"
tail -1 "$OUT/update_compile.log" | cut -c1-1500
fi

step done
