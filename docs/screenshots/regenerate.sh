#!/usr/bin/env bash
# Re-take the screenshots in this folder with `kvscope gui --screenshot` (offscreen, light theme, 1400x900).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
D=tests/data/llamacpp-2026-10-01
L=tests/data/lab/llamacpp-2026-10-01/llama
O=docs/screenshots
shot() { QT_QPA_PLATFORM=offscreen "$PY" -m kvscope.app.shell.cli "$@" --theme "${THEME:-light}"; }
shot $D/lfm2-f16-fa0-unified0-ctx.session --model $D/tiny-lfm2.gguf --screenshot $O/tree.png --view tree
shot $L/nan_rows_late_fail.seqdata.bin --model $D/tiny-llama.gguf --screenshot $O/bytemap.png --view bytemap
shot $D/lfm2-f16-fa0-unified0-ctx.session --model $D/tiny-lfm2.gguf --screenshot $O/hex.png --view hex
shot $D/llama-f16-fa1-unified1-frag-ctx.session --model $D/tiny-llama.gguf --screenshot $O/cells.png --view cells
shot $D/gemma2-f16-fa0-unified1-swafull0-ctx.session --model $D/tiny-gemma2.gguf --screenshot $O/cells-swa.png \
    --view cells
shot $D/lfm2-f16-fa0-unified0-ctx.session --model $D/tiny-lfm2.gguf --screenshot $O/layers.png --view layers
shot $D/lfm2-f16-fa0-unified0-ctx.session --screenshot $O/layers-no-model.png --view layers
shot $L/seq0.clean.seqstate --model $D/tiny-llama.gguf --screenshot $O/tokens.png --view tokens
shot $L/nan_rows_late_fail.seqdata.bin --model $D/tiny-llama.gguf --screenshot $O/findings.png --view findings
shot $L/nan_rows_valid.seqdata.bin --model $D/tiny-llama.gguf --diff $L/seq0.clean.seqdata.bin \
    --screenshot $O/diff.png --view diff
THEME=dark shot $D/llama-f16-fa1-unified1-frag-ctx.session --model $D/tiny-llama.gguf \
    --screenshot $O/layers-dark.png --view layers
shot $L/fa0-unified1/context.state.bin --model $D/tiny-llama.gguf --screenshot $O/lab.png --view lab
