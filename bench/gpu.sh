#!/usr/bin/env bash
# The trainer on one GPU, in one run: burnish's GRPO step against TRL's, side by side
# (bench/vs_trl.py: tokens/s, peak memory, share of the bf16 matmul peak, loss drift) on the
# 1.5B and 7B shapes (random weights of the real shapes) at prompt + completion 512 + 256 and
# 1024 + 512, then the trainer's own step phase by phase (bench/trainer_step.py) on the 1.5B
# shape, and its whole step as `burnish trainer` takes it (bench/trainer_whole.py: the real worker
# against a SQLite store of recorded calls, publishing to a loopback stand-in for vLLM, which the
# machine lacks; read, batch, step, save, record, publish). Writes $OUT/gpu-results.json (every
# figure), $OUT/gpu.md (the table) and $OUT/gpu.log.
#
#   bench/gpu.sh                 # on a GPU machine with torch, transformers, peft, accelerate
#   bench/gpu.sh --tiny          # the same flow on a tiny shape, anywhere (the CPU): to try it
#
# What the runs need beyond that machine's packages travels as wheels in .whl/ ($WHEELS), installed
# with --target into /tmp/site ($SITE); this checkout need not be installed (vs_trl.py links it).
# On the GPU machines lent here (python 3.12, which has torch, transformers, peft, accelerate,
# httpx, click, prometheus-client, markupsafe, typing-extensions), that is: TRL's side: trl,
# datasets, dill, multiprocess (and whatever pip lists for them that is missing); the store's,
# for trainer_step.py and trainer_whole.py: msgspec, sqlalchemy, greenlet, alembic, mako,
# aiosqlite. Fetched here, one version of each (NAME==VERSION where the newest would not suit the
# machine's torch or transformers), with
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#     -d .whl trl datasets dill multiprocess msgspec sqlalchemy greenlet alembic mako aiosqlite
# The log's first lines name any of them still missing.
# The runs stop starting at BUDGET_S seconds (default 460), so the whole stays inside 8 minutes.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-bench/results/gpu}
PY=${PYTHON:-python3}
WHEELS=${WHEELS:-.whl}
SITE=${SITE:-/tmp/site}
BUDGET_S=${BUDGET_S:-460}
mkdir -p "$OUT"
RUNS=$(mktemp -d)
LOG=$OUT/gpu.log
: >"$LOG"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error HF_HUB_DISABLE_PROGRESS_BARS=1
START=$SECONDS

if [ -d "$WHEELS" ] && ls "$WHEELS"/*.whl >/dev/null 2>&1; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$WHEELS"/*.whl 2>&1 | tee -a "$LOG"
    export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
fi

if [ "${1:-}" = "--tiny" ]; then
    ROWS="qwen2-tiny:64:32:off:off,selective qwen2-tiny:128:64:on:on"
    STEP_ARGS="--model qwen2-tiny --groups 2 --group-size 4 --prompt-len 64 --answer-len 16 --steps 1"
    WHOLE_ARGS="--model qwen2-tiny --groups 2 --group-size 4 --prompt-len 64 --answer-len 16 --passes 2"
    STEP_AFTER="qwen2-tiny:64:32:off:off,selective"
    COMMON="--warmup 1 --steps 2"
else
    # model:prompt:completion:TRL's checkpointing:burnish's (each a side of its own). TRL holds 7B
    # at 1024 + 512 only with checkpointing (about 135 GiB without, by the 512 + 256 row's
    # figure): both sides take it there, and burnish's selective checkpointing beside it.
    ROWS="qwen2.5-1.5b:512:256:off:off,selective qwen2.5-7b:512:256:off:off,selective qwen2.5-1.5b:1024:512:off:off,selective qwen2.5-7b:1024:512:on:on,selective"
    STEP_ARGS="--model qwen2.5-1.5b"
    WHOLE_ARGS="--model qwen2.5-1.5b --passes 2"  # the same batch: 4 groups x 8, 600 + 150 tokens a call
    STEP_AFTER="qwen2.5-1.5b:1024:512:off:off,selective"  # then the trainer's step and whole step, before the longest row
    COMMON="--warmup 2 --steps 5"
fi

{
    date -u
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null || echo "no nvidia-smi"
    $PY -c "import torch, transformers, peft, accelerate; print('torch', torch.__version__, 'transformers', transformers.__version__, 'peft', peft.__version__, 'accelerate', accelerate.__version__, 'cuda', torch.cuda.is_available())"
    $PY -c "import trl, datasets; print('trl', trl.__version__, 'datasets', datasets.__version__)"
    $PY -c "
import importlib.util
need = 'trl datasets dill multiprocess msgspec sqlalchemy greenlet alembic mako aiosqlite httpx'.split()
missing = [name for name in need if importlib.util.find_spec(name) is None]
print('missing, to travel as wheels:', ' '.join(missing) if missing else 'none')"
    git log -1 --format='commit %h %s' 2>/dev/null || true
} 2>&1 | tee -a "$LOG"

run() {  # a name, then the command; skipped once the budget is spent, cut at what is left of it
    local name=$1 left=$((BUDGET_S - (SECONDS - START)))
    shift
    if [ "$left" -lt 30 ]; then
        echo "== $name: skipped, $((SECONDS - START)) s of the budget spent" | tee -a "$LOG"
        return
    fi
    echo "== $name ($((SECONDS - START)) s in, at most $left s)" | tee -a "$LOG"
    timeout "$left" "$@" 2>&1 | tee -a "$LOG"
    echo "== $name: exit ${PIPESTATUS[0]} after $((SECONDS - START)) s" | tee -a "$LOG"
}

for row in $ROWS; do
    IFS=: read -r model prompt completion ckpt ours <<<"$row"
    run "vs_trl $model $prompt+$completion checkpointing TRL $ckpt, burnish $ours" $PY bench/vs_trl.py --model "$model" --trl-python "$PY" \
        --rank 16 --lr 5e-4 --rounds 1 --quiet-wait 0 --groups 2 --group-size 8 $COMMON \
        --prompt-len "$prompt" --completion-len "$completion" --checkpointing "$ckpt" --ours-checkpointing "$ours" \
        --results "$RUNS/vs_trl-$model-$prompt-$completion.json"
    if [ "$row" = "$STEP_AFTER" ]; then
        run "trainer step" $PY bench/trainer_step.py $STEP_ARGS --results "$RUNS/trainer_step.json"
        run "trainer whole step" $PY bench/trainer_whole.py $WHOLE_ARGS --results "$RUNS/trainer_whole.json"
    fi
done

$PY bench/gpu_summary.py "$RUNS" "$OUT/gpu-results.json" 2>&1 | tee "$OUT/gpu.md" | tee -a "$LOG"
echo "total $((SECONDS - START)) s" | tee -a "$LOG"
rm -rf "$RUNS"
