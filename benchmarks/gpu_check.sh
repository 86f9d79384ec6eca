#!/usr/bin/env bash
# GPU check: everything in this project that needs a real GPU, in one run of a few minutes,
# into ONE summary file (Markdown, JSON beside it; the steps' whole output in gpu_check.log).
#
#   benchmarks/gpu_check.sh [--cpu|--dry-run] [--out DIR] [--steps a,b] [--budget-s S] [--python PY]
#   benchmarks/gpu_check.sh --fetch-wheels      # here, with a registry: wheels the GPU box lacks, into .whl/
#
# Steps (each under its own `timeout`; a failed or timed-out step is recorded and the rest go on):
#   env            nvidia-smi, Python/torch/CUDA/NCCL versions, GPU count, the project imports that fail
#   gpu_tests      the pytest tests marked gpu (files that say mark.gpu)
#   engine_tp1     `ttft serve --device cuda` (TP 1), a short probe, the verdict of client + server captures
#   engine_tp2     the same with --tp 2            (two GPUs only)
#   engine_pp2     the same with --pp 2            (two GPUs and a `ttft serve --pp` only)
#   nvml           the NVML sampler against the real driver: every counter's value or its error
#   tracing        benchmarks/engine_tracing_overhead.py --device cuda, short
#   probe_overhead benchmarks/probe_overhead.py, 256 streams, --workers across the cores
#   scenarios      calibration on the device, then the fixed catalogue with every engine on it, fast
#                  scenarios first, in what is left of --budget-s (the rest are listed as not reached)
# --cpu (alias --dry-run) runs the same steps on CPU at tiny sizes in well under a minute of work
# (GPU-only steps record "skipped: no GPU"): what CI runs (tests/test_gpu_check.py).
#
# The GPU box (see the device notes): bare `python3` with torch+CUDA, no registry. The project is
# not installed there: it runs from this tree (PYTHONPATH), and wheels in .whl/ (or
# $GPU_CHECK_WHEELS) are installed into a scratch --target first, as those notes say.
# Exit status: 0 when no step failed or timed out, 1 otherwise, 2 on a usage error.
# A step's timeout can be changed with GPU_CHECK_TIMEOUT_<STEP> (seconds, e.g. GPU_CHECK_TIMEOUT_TRACING=30).
set -u -o pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MODE=gpu
OUT_DIR="${OUT:-${TMPDIR:-/tmp}/gpu-check}"  # $OUT: the device machine's folder that comes back
ONLY=""
BUDGET_S=""
PY="${PYTHON:-}"
FETCH=0
PLANNED="env,gpu_tests,engine_tp1,engine_tp2,engine_pp2,nvml,tracing,probe_overhead,scenarios"
usage() { sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'; }
die() { echo "gpu_check.sh: error: $1" >&2; exit 2; }
value() { [ $# -ge 2 ] && [ -n "$2" ] || die "$1 needs a value (see --help)"; }
while [ $# -gt 0 ]; do
  case "$1" in
    --cpu|--dry-run) MODE=cpu ;;
    --out) value "$@"; OUT_DIR="$2"; shift ;;
    --steps) value "$@"; ONLY=",$2,"; shift ;;
    --budget-s) value "$@"; BUDGET_S="$2"; shift ;;
    --python) value "$@"; PY="$2"; shift ;;
    --fetch-wheels) FETCH=1 ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
  shift
done
for s in ${ONLY//,/ }; do
  [[ ",$PLANNED," == *",$s,"* ]] || die "unknown step '$s' in --steps; the steps: $PLANNED"
done
if [ -z "$PY" ]; then
  if [ -x "$ROOT/.venv/bin/python" ]; then PY="$ROOT/.venv/bin/python"; else PY=python3; fi
fi
if ! command -v "$PY" >/dev/null 2>&1; then
  die "no Python interpreter '$PY'"
fi
if [ "$FETCH" = 1 ]; then
  exec "$PY" "$ROOT/benchmarks/gpu_check_wheels.py" --dest "${GPU_CHECK_WHEELS:-$ROOT/.whl}"
fi
case "$BUDGET_S" in
  '') if [ "$MODE" = gpu ]; then BUDGET_S=420; else BUDGET_S=120; fi ;;
  *[!0-9]*) die "--budget-s must be whole seconds, got '$BUDGET_S'" ;;
esac

mkdir -p "$OUT_DIR" 2>/dev/null || die "cannot create the output directory '$OUT_DIR'"
OUT_DIR="$(cd "$OUT_DIR" && pwd)"
SUMMARY="$OUT_DIR/gpu_check_summary.md"
LOG="$OUT_DIR/gpu_check.log"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/gpu-check.XXXXXX")"
RECORDS="$WORK/steps.jsonl"
: >"$RECORDS"
: >"$LOG"
START_S=$SECONDS
cd "$ROOT" || exit 2
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1

json_str() { local s=${1//\\/\\\\}; s=${s//\"/\\\"}; s=${s//$'\t'/ }; s=${s//$'\n'/ }; printf '"%s"' "$s"; }

record() {  # record STEP STATUS RC WALL_S TIMEOUT_S NOTE CMD LOGFILE
  printf '{"step": %s, "status": %s, "rc": %s, "wall_s": %s, "timeout_s": %s, "note": %s, "cmd": %s, "log": %s}\n' \
    "$(json_str "$1")" "$(json_str "$2")" "${3:-null}" "${4:-null}" "${5:-null}" "$(json_str "$6")" \
    "$(json_str "$7")" "$(json_str "$8")" >>"$RECORDS"
  summarize
}

commit_desc() {  # the tree's commit, where it is a git checkout (the device copy may not be)
  local c
  c="$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null)" || { echo "not a git checkout"; return; }
  git -C "$ROOT" diff --quiet HEAD 2>/dev/null && echo "$c" || echo "$c (+ local changes)"
}

summarize() {
  "$PY" "$ROOT/benchmarks/gpu_check_summary.py" --records "$RECORDS" --planned "$PLANNED" --mode "$MODE" \
    --budget-s "$BUDGET_S" --total-wall-s "$((SECONDS - START_S))" --out "$SUMMARY" \
    --header "host=$(hostname 2>/dev/null || echo '?'), $(nproc 2>/dev/null || echo '?') CPUs" \
    --header "date=$(date -u +%Y-%m-%dT%H:%M:%SZ)" --header "python=$PY" --header "gpus=${GPUS:-?}" \
    --header "commit=$(commit_desc)" \
    || echo "gpu_check.sh: warning: the summary could not be written" >&2
}

selected() { [ -z "$ONLY" ] || [[ "$ONLY" == *",$1,"* ]]; }

skip() {  # skip STEP REASON
  echo "== $1: skipped: $2" | tee -a "$LOG"
  record "$1" skipped "" "" "" "skipped: $2" "" ""
}

step() {  # step STEP TIMEOUT_S COMMAND (a bash command line)
  local name=$1 t=$2 cmd=$3 var rc status note t0 wall steplog
  if ! selected "$name"; then skip "$name" "not selected (--steps)"; return 0; fi
  var="GPU_CHECK_TIMEOUT_$(echo "$name" | tr '[:lower:]' '[:upper:]')"
  t="${!var:-$t}"
  steplog="$WORK/$name.log"
  echo "== $name (timeout ${t}s): $cmd" | tee -a "$LOG"
  t0=$SECONDS
  timeout -k 10 "$t" bash -c "$cmd" >"$steplog" 2>&1 </dev/null
  rc=$?
  wall=$((SECONDS - t0))
  case $rc in
    0) status=ok; note="" ;;
    124|137) status=timeout; note="timed out after ${t} s (killed); its output so far is below" ;;
    *) status=failed; note="exit status $rc" ;;
  esac
  cat "$steplog" >>"$LOG"
  echo "== $name: $status (${wall} s)" | tee -a "$LOG"
  record "$name" "$status" "$rc" "$wall" "$t" "$note" "$cmd" "$steplog"
}

# --- the interpreter's path: this tree, and carried wheels where there are any ------------------
WHEELS="${GPU_CHECK_WHEELS:-$ROOT/.whl}"
if compgen -G "$WHEELS/*.whl" >/dev/null; then
  echo "== installing $(ls "$WHEELS"/*.whl | wc -l) wheels from $WHEELS into $WORK/site" | tee -a "$LOG"
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$WORK/site" \
    "$WHEELS"/*.whl >>"$LOG" 2>&1 || echo "   wheel install failed (see the log); going on" | tee -a "$LOG"
  export PATH="$WORK/site/bin:$PATH"
  export PYTHONPATH="$WORK/site:$ROOT${PYTHONPATH:+:$PYTHONPATH}"
else
  export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
fi
export PY WORK MODE
STEPS_PY="\"$PY\" benchmarks/gpu_check_steps.py"

GPUS=0
if [ "$MODE" = gpu ]; then
  GPUS="$("$PY" -c 'import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)' 2>/dev/null | tail -n 1)"
  case "$GPUS" in ''|*[!0-9]*) GPUS=0 ;; esac
fi
CORES="$(nproc 2>/dev/null || echo 2)"
NOGPU="no GPU"; [ "$MODE" = cpu ] && NOGPU="no GPU (cpu mode)"

# --- 1. environment ---------------------------------------------------------------------------
step env 45 "if command -v nvidia-smi >/dev/null; then nvidia-smi; nvidia-smi --query-gpu=index,name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv; [ $GPUS -gt 1 ] && nvidia-smi topo -m; else echo 'nvidia-smi: not found'; fi; echo; nproc; $STEPS_PY env $([ "$GPUS" -lt 1 ] && echo --quick)"

if [ "$MODE" = gpu ] && [ "$GPUS" -lt 1 ]; then
  for s in gpu_tests engine_tp1 engine_tp2 engine_pp2 nvml tracing probe_overhead scenarios; do
    skip "$s" "no GPU: torch sees none (run with --cpu for the CPU dry run)"
  done
  summarize; echo "summary: $SUMMARY"; rm -rf "$WORK"; exit 1
fi

# --- 2. the gpu-marked tests ------------------------------------------------------------------
if [ "$MODE" = gpu ]; then
  GPU_TESTS="$(grep -rl --include='*.py' -e 'mark\.gpu' tests | sort | tr '\n' ' ')"
  if [ -n "$GPU_TESTS" ]; then
    step gpu_tests 90 "\"$PY\" -m pytest -m gpu -q -rs $GPU_TESTS"
  else
    skip gpu_tests "no test file says mark.gpu"
  fi
else
  skip gpu_tests "$NOGPU"
fi

# --- 3. the bundled engine --------------------------------------------------------------------
if [ "$MODE" = gpu ]; then
  ENGINE="--device cuda --requests 64 --concurrency 8 --input-tokens 256 --output-tokens 32"
else
  ENGINE="--device cpu --requests 6 --concurrency 2 --input-tokens 32 --output-tokens 8"
fi
step engine_tp1 75 "$STEPS_PY engine $ENGINE --tp 1 --work $WORK/engine-tp1"
if [ "$GPUS" -ge 2 ]; then
  step engine_tp2 75 "$STEPS_PY engine $ENGINE --tp 2 --work $WORK/engine-tp2"
  if "$PY" -m diag serve --help 2>/dev/null | grep -q -e '--pp'; then
    step engine_pp2 75 "$STEPS_PY engine $ENGINE --pp 2 --work $WORK/engine-pp2"
  else
    skip engine_pp2 "this tree's ttft serve has no --pp flag"
  fi
else
  skip engine_tp2 "needs 2 GPUs ($GPUS here)"
  skip engine_pp2 "needs 2 GPUs ($GPUS here)"
fi

# --- 4. NVML against the real driver ----------------------------------------------------------
if [ "$MODE" = gpu ]; then
  step nvml 30 "$STEPS_PY nvml --seconds 2 --require-gpu"
else
  step nvml 30 "$STEPS_PY nvml --seconds 0.5"
fi

# --- 5. tracing overhead ----------------------------------------------------------------------
if [ "$MODE" = gpu ]; then
  step tracing 75 "\"$PY\" benchmarks/engine_tracing_overhead.py --device cuda --rounds 6 --requests 16 --max-tokens 32 --waves 2"
else
  step tracing 45 "\"$PY\" benchmarks/engine_tracing_overhead.py --device cpu --rounds 2 --requests 2 --max-tokens 4 --prompt-words 10"
fi

# --- 6. the probe's own overhead, its workers across the cores (one core for the instant server) ---
if [ "$MODE" = gpu ]; then
  W=$((CORES > 3 ? CORES - 2 : 1))
  step probe_overhead 90 "\"$PY\" benchmarks/probe_overhead.py --concurrency 256 --requests 1024 --rounds 1 --workers $W"
else
  step probe_overhead 60 "\"$PY\" benchmarks/probe_overhead.py --concurrency 8 --requests 16 --rounds 1 --workers 2 --chunks 4 --itl-ms 5"
fi

# --- 7. the fixed scenario catalogue, in what is left of the budget -----------------------------
if [ "$MODE" = gpu ]; then
  LEFT=$((BUDGET_S - (SECONDS - START_S) - 15))
  if [ "$LEFT" -ge 60 ]; then
    step scenarios "$LEFT" "$STEPS_PY scenarios --device cuda --gpus $GPUS --budget-s $((LEFT - 20)) --work $WORK/scenarios"
  else
    skip scenarios "only ${LEFT} s of the ${BUDGET_S} s budget left"
  fi
else
  skip scenarios "cpu mode runs no catalogue (its calibration alone takes ~30 s on 2 cores; ttft scenarios check is the CPU catalogue)"
fi

summarize
echo "summary: $SUMMARY (log: $LOG)"
STATUS=0
grep -q -E '"status": "(failed|timeout)"' "$RECORDS" && STATUS=1
rm -rf "$WORK"
exit $STATUS
