#!/usr/bin/env bash
# Re-write the example reports in this folder with `kvscope report` (headless, from the repository root,
# so the paths inside the reports are relative).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
M=tests/data/llamacpp-2026-10-01/tiny-llama.gguf
L=tests/data/lab/llamacpp-2026-10-01/llama/fa0-unified1
O=docs/examples
report() { "$PY" -m kvscope.core.report.cli "$@"; }
# A blob whose restore llama.cpp rejects late: NaN K/V rows, then a V record with the wrong element size.
report $L/nan_rows_late_fail.seqdata.bin --model $M -o $O/nan-rows-late-fail
# A blob that restores fine but carries NaN rows, run through the lab (its scenario folder is the live
# context) and compared with the clean blob it was made from.
report $L/nan_rows_valid.seqdata.bin --model $M --lab --compare $L/seq0.clean.seqdata.bin -o $O/nan-rows-valid-lab
