#!/usr/bin/env bash
# One command for a GPU box (an offline CUDA image, e.g. one H200 lent for ~15 minutes): install what the image
# lacks from wheels brought with the tree, then gpu_evidence (two new seeds of the four arms + the shared-GPU
# efficiency variants), gpu_step (the interleaved loop-overhead interval) and the GPU test tier, each under a
# wall-clock cap, all within BUDGET (540 s). Headline figures print as they come; every log lands in $WORK
# and the few files worth keeping in $OUT (at most 8 files come back from a lent machine: see README.md).
#
#   bash launch/gpu/run.sh                       # every phase, from the repository root
#   bash launch/gpu/run.sh evidence step         # some phases (install and env always run)
#   DRY_RUN=1 bash launch/gpu/run.sh             # on a CPU: every phase at smoke size against the same caps
#
# Phases and caps (s): install 60 | env 40 | evidence 330 (seeds 220 + efficiency 75 inside) | step 110 |
# tier: what is left, at most TIER_CAP (120). Each benchmark stops itself inside its cap (its own budget
# flag); the cap (timeout, then KILL of the phase's process group) is the backstop.
set -u
PY=${PY:-python3}
OUT=${OUT:-$PWD/launch/gpu/out}
WORK=${WORK:-/tmp/decentrain_gpu}
WHEELS=${WHEELS:-launch/gpu/wheels}
SITE=${SITE:-/tmp/decentrain_site}
BUDGET=${BUDGET:-540}
DRY_RUN=${DRY_RUN:-0}
EVIDENCE_ARGS=${EVIDENCE_ARGS:-}   # more gpu_evidence flags, e.g. "--compile blocks"
STEP_ARGS=${STEP_ARGS:-}           # more gpu_step flags, e.g. "--compile model --micro-batch 32"
TIER_ARGS=${TIER_ARGS:-}           # more pytest flags, e.g. "-k 'not sapo'" without reasoning-gym's wheels
TIER_CAP=${TIER_CAP:-120}          # the whole tier took 185 s on 6 workers (H200): alone, `run.sh tier` with 300
PHASES=${*:-evidence step tier}
T0=$(date +%s)
mkdir -p "$OUT" "$WORK"
: > "$WORK/summary.tsv"; : > "$WORK/run.log"

note() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a "$WORK/run.log"; }
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
# phase NAME CAP HEADLINE_REGEX cmd...: run under a cap (its process group killed at the end), log to
# $WORK/NAME.log, print the lines matching HEADLINE_REGEX as they come, record "NAME rc seconds cap"
phase() {
  local name=$1 cap=$2 pattern=$3; shift 3
  local t=$(date +%s)
  if [ "$cap" -lt 15 ]; then note "skip $name: ${cap}s left of the budget"; printf '%s\tskipped\t0\t%s\n' "$name" "$cap" >> "$WORK/summary.tsv"; return 0; fi
  note "start $name (cap ${cap}s): $(echo "$*" | cut -c1-160)"
  timeout -k 10 "$cap" "$@" 2>&1 | tee "$WORK/$name.log" | grep --line-buffered -E "$pattern" | while IFS= read -r l; do note "  $l"; done
  local rc=${PIPESTATUS[0]} s=$(( $(date +%s) - t ))
  printf '%s\t%s\t%s\t%s\n' "$name" "$rc" "$s" "$cap" >> "$WORK/summary.tsv"
  note "end   $name rc=$rc ${s}s of ${cap}s$([ "$rc" = 124 ] || [ "$rc" = 137 ] && echo ' CAPPED')"
  collect
  return "$rc"
}
# what comes back: 7 files and one archive of everything (re-made after every phase: a killed run keeps the last)
collect() {
  for f in benchmarks/results/gpu_evidence.json benchmarks/results/gpu_evidence.txt benchmarks/results/ledger/gpu_evidence.jsonl \
           benchmarks/results/gpu_step.json benchmarks/results/gpu_step.txt; do
    [ -f "$f" ] && [ "$f" -nt "$WORK/.start" ] && cp "$f" "$OUT/"
  done
  cp "$WORK/run.log" "$WORK/summary.tsv" "$OUT/" 2> /dev/null
  for d in benchmarks/results runs/gpu_evidence_logs runs/bench_smoke; do
    [ -d "$d" ] && find "$d" -maxdepth 2 -newer "$WORK/.start" -type f \( -name 'gpu_*' -o -name '*.log' \) \
      -exec cp --parents {} "$WORK/" \; 2> /dev/null
  done
  tar czf "$OUT/logs.tar.gz" -C "$WORK" --exclude=logs.tar.gz . 2> /dev/null
}
touch "$WORK/.start"

# ---- install: wheels -> $SITE (the image's own torch stays) --------------------------------------
if ls "$WHEELS"/*.whl > /dev/null 2>&1; then
  mkdir -p "$SITE"
  PIP=("$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE")
  if ! phase install 60 '^ERROR' "${PIP[@]}" "$WHEELS"/*.whl; then  # a binary wheel for another Python: keep the pure ones
    phase install_pure 60 '^ERROR' "${PIP[@]}" $(ls "$WHEELS"/*-none-any.whl)
  fi
else
  note "no wheels in $WHEELS: relying on the image's packages (hydra-core and omegaconf are needed: launch/gpu/prepare.sh)"
fi
export PYTHONPATH=$PWD:$SITE${PYTHONPATH:+:$PYTHONPATH}
export HF_HUB_OFFLINE=1 WANDB_MODE=offline PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-/tmp/decentrain_inductor}
# the pinned corpus subset travels as launch/gpu/corpus/*.tar.xz (unpacked once beside itself, ignored by git)
PACK=$(ls launch/gpu/corpus/*.tar.xz 2> /dev/null | head -1)
if [ -z "${DECENTRAIN_DATA:-}" ] && [ -n "$PACK" ]; then export DECENTRAIN_DATA=$PWD/$PACK; fi
DATA=${DATA:-$([ -n "${DECENTRAIN_DATA:-}" ] && echo pinned || echo offline)}

# ---- env: what this box is, and whether the tree is the commit it claims ----------------------------
phase env 40 '^(gpu|torch|tree|corpus|mps|MISSING)' "$PY" - "$DATA" <<'EOF'
import importlib, os, shutil, subprocess, sys
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print("gpu", p.name, f"{p.total_memory / 2**30:.0f} GiB, {p.multi_processor_count} SMs, bf16", torch.cuda.is_bf16_supported())
for m in ("hydra", "omegaconf", "scipy", "transformers", "reasoning_gym", "cryptography", "xdist"):
    try:
        print(f"  {m:14s} {getattr(importlib.import_module(m), '__version__', '?')}")
    except Exception as e:
        print(f"MISSING {m} ({type(e).__name__}){' : the runs need it' if m in ('hydra', 'omegaconf', 'scipy') else ''}")
import recipes.train, benchmarks.gpu_evidence, benchmarks.gpu_step  # noqa: F401
try:
    sha = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--", ".", ":!benchmarks/results"], capture_output=True, text=True).stdout
    print("tree", sha, "DIRTY: evidence will be marked dirty and left out of the pool\n" + dirty[:800] if dirty.strip() else "clean")
except (OSError, subprocess.CalledProcessError):
    print("tree: no git here: evidence will be marked dirty and left out of the pool")
print("corpus", f"data={sys.argv[1]}", os.environ.get("DECENTRAIN_DATA", "(the box's own text: data=offline)"))
print("mps", shutil.which("nvidia-cuda-mps-control") or "absent: the processes_mps variant will say so")
EOF

if [ "$DRY_RUN" = 1 ]; then  # the same phases at smoke size on a CPU: the plumbing, and each phase inside its cap
  EV=(--smoke --efficiency threads_eager --efficiency-budget-s 75)
  ST=(--smoke)
else
  EV=(--data "$DATA" --allow-dirty --budget-s 220 --efficiency default --efficiency-budget-s 75)
  ST=(--allow-dirty --budget-s 80)
fi
cap() { local l=$(( $(left) - 10 )); [ "$l" -lt "$1" ] && echo "$l" || echo "$1"; }

for p in $PHASES; do
  case $p in
    evidence) phase evidence "$(cap 330)" '^\[gpu_evidence\]|^config error|Error' \
                "$PY" -m benchmarks.gpu_evidence "${EV[@]}" $EVIDENCE_ARGS ;;
    step)     phase step "$(cap 110)" '^seed |decentrain / bare|^ *(bare|decentrain) \||Error' \
                "$PY" -m benchmarks.gpu_step "${ST[@]}" $STEP_ARGS ;;
    tier)     XDIST=""  # workers only where there are cores to spare (the GPU box has 16; a dry run's CPU may not)
              [ "$DRY_RUN" != 1 ] && "$PY" -c "import xdist" 2> /dev/null && XDIST="-n 8"
              phase tier "$(cap "$TIER_CAP")" '(FAILED|ERROR) |[0-9]+ (passed|failed|skipped)' \
                "$PY" -m pytest -m gpu tests/gpu -v -rfE $XDIST -p no:cacheprovider --junitxml="$WORK/pytest_gpu.xml" $TIER_ARGS ;;
    env) ;;  # install and env always run: `run.sh env` runs only them
    *) note "unknown phase $p (evidence, step, tier)";;
  esac
done

note "done in $(( $(date +%s) - T0 ))s of ${BUDGET}s; phase rc seconds cap:"
column -t "$WORK/summary.tsv" | tee -a "$WORK/run.log"
collect
ls -la "$OUT" | tee -a "$WORK/run.log"
