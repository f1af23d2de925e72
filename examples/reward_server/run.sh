#!/usr/bin/env bash
# The reward server's demo (examples/reward_server/README.md): a tiny SFT policy and reward model,
# the reward model served by `rlhf serve-rm`, one GRPO run scored over HTTP (--reward-url) and the
# same run scored by the reward model loaded locally (--reward-model); their rewards must match.
#   bash examples/reward_server/run.sh             # into a fresh folder of runs/reward_server
#   OUT=elsewhere ITERATIONS=2 STEPS=20 bash examples/reward_server/run.sh
# A laptop CPU, nothing downloaded, a couple of minutes. The server listens on 127.0.0.1 only and
# is stopped when the script ends, however it ends.
set -euo pipefail
OUT=${OUT:-runs/reward_server}
ITERATIONS=${ITERATIONS:-2}  # GRPO iterations of each run
STEPS=${STEPS:-20}           # optimizer steps of `rlhf sft` and of `rlhf rm`
HERE=$(dirname "$0")
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} TOKENIZERS_PARALLELISM=false  # tiny models: one thread is fastest
export HF_HUB_DISABLE_PROGRESS_BARS=1

logged() {  # logged LOG COMMAND...: COMMAND's output into LOG; on failure, its last lines and its exit code
    local log=$1 status=0
    shift
    "$@" > "$log" 2>&1 || status=$?
    if [ "$status" -ne 0 ]; then
        echo "failed (exit $status): $*" >&2
        tail -n 20 "$log" >&2
        exit "$status"
    fi
}

mkdir -p "$OUT"
RUN=$(mktemp -d "$OUT/$(date +%Y%m%d-%H%M%S).XXXX")  # a fresh folder: nothing already in OUT is touched
echo "== everything goes under $RUN"

echo "== 1. a tiny base model and data ($RUN/data)"
python "$HERE/prepare.py" --out "$RUN/data"

echo "== 2. rlhf sft, rlhf rm ($STEPS steps each)"
SHORT=(--train.max_steps "$STEPS" --train.batch_size 8 --train.device cpu --data.test_fraction 0.25 --sinks jsonl)
logged "$RUN/sft.log" rlhf sft --model "$RUN/data/base" --data "$RUN/data/sft.jsonl" --out "$RUN/sft" "${SHORT[@]}"
logged "$RUN/rm.log" rlhf rm --model "$RUN/sft" --data "$RUN/data/pairs.jsonl" --out "$RUN/rm" "${SHORT[@]}"

echo "== 3. rlhf serve-rm --reward-model $RUN/rm --port 0 (in the background; log: $RUN/server.log)"
rlhf serve-rm --reward-model "$RUN/rm" --host 127.0.0.1 --port 0 --device cpu > "$RUN/server.log" 2>&1 &
SERVER=$!
stop_server() {
    if kill -0 "$SERVER" 2> /dev/null; then
        kill "$SERVER" 2> /dev/null || true  # SIGTERM: serve-rm stops and exits 0
        wait "$SERVER" 2> /dev/null || true
        echo "== the reward server (pid $SERVER) stopped"
    fi
}
trap stop_server EXIT
trap 'exit 130' INT  # Ctrl-C and SIGTERM end the script through the EXIT trap too
trap 'exit 143' TERM

URL=""
for _ in $(seq 240); do  # up to 120 s for the model to load and the line naming the URL
    URL=$(grep -o 'http://127\.0\.0\.1:[0-9]*' "$RUN/server.log" | head -n 1 || true)
    if [ -n "$URL" ]; then break; fi
    if ! kill -0 "$SERVER" 2> /dev/null; then
        echo "rlhf serve-rm ended before serving:" >&2
        cat "$RUN/server.log" >&2
        exit 1
    fi
    sleep 0.5
done
if [ -z "$URL" ]; then
    echo "rlhf serve-rm printed no URL within 120 s (log: $RUN/server.log)" >&2
    exit 1
fi
python - "$URL" <<'PY'
import json, sys, time, urllib.request
url = sys.argv[1] + "/health"
for attempt in range(60):  # up to 30 s
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            print(f"   {url}: {json.load(answer)}")
            break
    except OSError:
        time.sleep(0.5)
else:
    sys.exit(f"{url} did not answer within 30 s")
PY

echo "== 4. rlhf train --preset grpo --reward-url $URL ($ITERATIONS iterations)"
GRPO=(--preset grpo --policy "$RUN/sft" --prompts "$RUN/data/prompts.jsonl" --train.iterations "$ITERATIONS"
      --rollout.batch_size 4 --rollout.samples_per_prompt 4 --rollout.max_new_tokens 4
      --train.micro_batch_size 16 --train.device cpu --policy_optim.lr 0.001 --log.sinks jsonl --seed 0)
logged "$RUN/grpo_remote.log" rlhf train "${GRPO[@]}" --reward-url "$URL" --out "$RUN/grpo_remote"
stop_server

echo "== 5. the same run with the reward model loaded locally: --reward-model $RUN/rm"
logged "$RUN/grpo_local.log" rlhf train "${GRPO[@]}" --reward-model "$RUN/rm" --out "$RUN/grpo_local"

echo "== 6. the two runs' rewards, iteration by iteration"
python "$HERE/compare.py" "$RUN/grpo_remote" "$RUN/grpo_local"
