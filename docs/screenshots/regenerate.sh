#!/usr/bin/env bash
# Re-take the screenshots in this folder with `kvscope gui --screenshot` (offscreen): every view at
# 1920x1080 and 1280x800, light and dark, named VIEW-WxH-THEME.png, plus two variants at 1280x800 light
# (the sliding-window cell map, the layer view without a model; EXTRAS=0 skips them), and the Overview and
# the Layers view after Tools > Verify in real llama.cpp b11434 (`--verify`; the engine extra and the pinned
# build are needed, VERIFY=0 skips them) of a slot file damaged through its structure (NaN in two cells of
# V layer 1, zeros in two of K layer 0): VIEW-verify-WxH-THEME.png. SIZES / THEMES / VIEWS narrow it down:
#   SIZES=1280x800 THEMES=dark VIEWS="layers cells" EXTRAS=0 VERIFY=0 docs/screenshots/regenerate.sh
# QPA=xcb takes them in the X server of $DISPLAY (Xvfb) instead of offscreen.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
D=tests/data/llamacpp-2026-10-01
L=tests/data/lab/llamacpp-2026-10-01/llama
O=docs/screenshots
SIZES=${SIZES:-"1920x1080 1280x800"}
THEMES=${THEMES:-"light dark"}
VIEWS=${VIEWS:-"overview tree bytemap hex cells layers tokens findings diff lab"}

shot() {  # shot VIEW SIZE THEME OUT ARGS...
    local view=$1 size=$2 theme=$3 out=$4
    shift 4
    QT_QPA_PLATFORM=${QPA:-offscreen} "$PY" -m kvscope.app.shell.cli "$@" --view "$view" --size "$size" --theme "$theme" \
        --screenshot "$out" >/dev/null
    echo "$out"
}

# the file (and options) each view is pictured with
args_for() {
    case $1 in
        overview) echo "$L/seq_file_truncated_half.seqstate --model $D/tiny-llama.gguf" ;;
        tree) echo "$D/lfm2-f16-fa0-unified0-ctx.session --model $D/tiny-lfm2.gguf" ;;
        bytemap) echo "$L/nan_rows_late_fail.seqdata.bin --model $D/tiny-llama.gguf" ;;
        hex) echo "$D/llama-q8_0-fa1-unified0-ctx.session --model $D/tiny-llama.gguf" ;;
        cells) echo "$D/llama-f16-fa1-unified1-frag-ctx.session --model $D/tiny-llama.gguf" ;;
        layers) echo "$D/lfm2-f16-fa0-unified0-ctx.session --model $D/tiny-lfm2.gguf" ;;
        tokens) echo "$L/seq0.clean.seqstate --model $D/tiny-llama.gguf" ;;
        findings) echo "$L/nan_rows_late_fail.seqdata.bin --model $D/tiny-llama.gguf" ;;
        diff) echo "$L/nan_rows_valid.seqdata.bin --model $D/tiny-llama.gguf --diff $L/seq0.clean.seqdata.bin" ;;
        lab) echo "$L/fa0-unified1/context.state.bin --model $D/tiny-llama.gguf" ;;
        *) echo "unknown view $1" >&2; exit 2 ;;
    esac
}

for view in $VIEWS; do
    for size in $SIZES; do
        for theme in $THEMES; do
            # shellcheck disable=SC2046  # the file and its options are separate words
            shot "$view" "$size" "$theme" "$O/$view-$size-$theme.png" $(args_for "$view")
        done
    done
done
if [[ ${VERIFY:-1} != 0 ]]; then
    G=tests/data/gen-b11434/llama-f16-fa0-unified0-seq0.seqstate
    M=tests/data/gen-models/llama.gguf
    tmp=${TMPDIR:-/tmp}/kvscope-screenshots  # a fixed name: the Overview shows the file's path
    mkdir -p "$tmp"
    trap 'rm -rf "$tmp"' EXIT
    "$PY" - "$G" "$M" "$tmp/llama-damaged.seqstate" <<'PYEOF'
import sys
from kvscope.core.lab.corruptions import parse_spec
from kvscope.core.model.profile import load_model_profile
src, model, out = sys.argv[1:]
prof, data = load_model_profile(model), open(src, "rb").read()
for spec in ("fill:value=nan,role=v,il=1,cells=1-2", "fill:value=0,role=k,il=0,cells=2-3"):
    data = parse_spec(spec).apply(data, prof).data
open(out, "wb").write(data)
PYEOF
    for view in overview layers; do
        for size in $SIZES; do
            for theme in $THEMES; do
                shot "$view" "$size" "$theme" "$O/$view-verify-$size-$theme.png" "$tmp/llama-damaged.seqstate" \
                    --model "$M" --engine llama.cpp --verify
            done
        done
    done
fi
if [[ ${EXTRAS:-1} != 0 ]]; then
    shot cells 1280x800 light "$O/cells-swa-1280x800-light.png" $D/gemma2-f16-fa0-unified1-swafull0-ctx.session \
        --model $D/tiny-gemma2.gguf
    shot layers 1280x800 light "$O/layers-no-model-1280x800-light.png" $D/lfm2-f16-fa0-unified0-ctx.session
fi
