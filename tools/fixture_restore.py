"""Failed-restore experiments for ``tools/gen_fixtures.py``: what a real llama.cpp build does when
a state it wrote comes back damaged or into the wrong context.

Each case runs in a fresh child (``LlamaProcess``) holding every prompt of the scenario, so the
observation shows the target sequence (0) and the other sequences afterwards. Cases:

- ``truncated_1``: the seq-0 blob less its last byte, ``llama_state_seq_set_data``;
- ``truncated_100``: the seq-0 file less its last 100 bytes, ``llama_state_seq_load_file``;
- ``rot_mismatch``: the seq-0 blob of scenario C (rotated q8_0) into a scenario D context
  (``LLAMA_ATTN_ROT_DISABLE=1``), ``llama_state_seq_set_data``;
- ``wrong_k_type``: the seq-0 blob with its first K (recurrent: R) type field changed;
- ``wrong_cell_count``: the seq-0 blob with its first non-empty cell_count increased by one.
"""

from __future__ import annotations

import os
import re
import struct
import tempfile
from typing import Any

import numpy as np

from kvscope.core.engine.llamacpp import CtxParams, LlamaProcess

_VOLATILE = re.compile(r"\d+(\.\d+)? ms\b|took \d")
_SOURCE_PATH = re.compile(r"\S*/(?=(src|ggml|common|tools)/\S+\.(c|cpp|h):\d+)")


def relevant_log(lines: list[str]) -> list[str]:
    """The log lines worth recording: warnings and errors, without timings, and source paths made
    relative to the llama.cpp tree (the build folder differs from machine to machine)."""
    out = []
    for ln in lines:
        low = ln.lower()
        if ("error" in low or "warn" in low or "fail" in low or "incompatible" in low or "mismatch" in low
                or "assert" in low) and not _VOLATILE.search(ln):
            out.append(_SOURCE_PATH.sub("", ln.strip()))
    return out


_PAST_EOF = re.compile(r"\((\d{5,}) instead of ")


def past_eof(lines: list[str]) -> tuple[list[str], bool]:
    """A seq file cut short is read past its end: ``llama_file::read_raw_unsafe`` reads nothing there
    and the field keeps whatever the stack held, so the value llama.cpp prints differs from run to
    run. Such values (an impossible count of five digits or more) become ``<uninitialised>``."""
    out = [_PAST_EOF.sub("(<uninitialised> instead of ", ln) for ln in lines]
    return out, out != lines


def positions(p: LlamaProcess, n_seq: int) -> dict[str, list[int]]:
    return {str(s): [p.seq_pos_min(s), p.seq_pos_max(s)] for s in range(n_seq)}


def _first_kv_fields(layout: dict[str, Any]) -> tuple[int, int] | None:
    """(offset of the first K/R type field, offset of the first non-empty cell_count)."""
    type_off = count_off = None
    for part in layout["parts"]:
        if part["kind"] == "kv":
            for st in part["streams"]:
                if st["cell_count"] and count_off is None:
                    count_off = st["cell_count_offset"]
                if st.get("k_data_offsets") and type_off is None:
                    type_off = st["k_data_offsets"][0] - 12
        elif part["kind"] == "recurrent":
            if count_off is None and part["cell_count"]:
                count_off = part["cell_count_offset"]
            if type_off is None and part["r_layers"]:
                # cell_count, cells (8 bytes each, per-seq n_seq_id = 0), s_trans, n_layer
                type_off = part["offset"] + 4 + 8 * part["cell_count"] + sum(4 * len(c[1]) for c in
                                                                              part["cells_pos_seqids"]) + 8
    if type_off is None or count_off is None:
        return None
    return type_off, count_off


class Restorer:
    """Runs the cases of one model in one build."""

    def __init__(self, model_path: str, build: str, prompts: dict[int, list[int]]) -> None:
        self.model_path = model_path
        self.build = build
        self.prompts = prompts

    def _child(self, cp: CtxParams) -> LlamaProcess:
        p = LlamaProcess(self.model_path, cp, build=self.build, timeout_s=120)
        for sid, toks in self.prompts.items():
            out = p.decode(sid, toks)
            if not (out.ok and out.rc == 0):
                p.close()
                raise RuntimeError(f"decode of seq {sid} failed: {out.summary()} rc={out.rc}")
        return p

    def run(self, case: str, cp: CtxParams, data: bytes, *, as_file: bool, mutation: dict[str, Any],
            scenario: str, writer: dict[str, Any]) -> dict[str, Any]:
        n_seq = len(self.prompts)
        p = self._child(cp)
        try:
            before = positions(p, n_seq)
            with tempfile.TemporaryDirectory(prefix="kvscope-restore-") as td:
                if as_file:
                    path = os.path.join(td, "case.seqstate")
                    with open(path, "wb") as fh:
                        fh.write(data)
                    out = p.state_seq_load_file(path, 0, 4096)
                    api = "llama_state_seq_load_file(dest_seq_id=0)"
                else:
                    out = p.state_seq_set_data(data, 0, 0)
                    api = "llama_state_seq_set_data(dest_seq_id=0)"
            rec: dict[str, Any] = {
                "case": case,
                "scenario": scenario,
                "context_params": cp.to_json(),
                "api": api,
                "mutation": mutation,
                "before": before,
                "aborted": out.aborted,
                "return": out.rc if out.aborted is None else None,
                "log": relevant_log(out.log),
            }
            if as_file:
                rec["log"], changed = past_eof(rec["log"])
                if changed:
                    rec["log_note"] = ("values read past the end of the file are uninitialised memory "
                                       "(llama_file::read_raw_unsafe reads short): replaced by <uninitialised>")
            if out.aborted is None:
                after = positions(p, n_seq)
                rec["after"] = after
                rec["target_seq0_removed"] = after["0"] == [-1, -1]
                rec["other_seqs_unchanged"] = all(after[s] == before[s] for s in after if s != "0")
                if after["0"][1] >= 0:
                    # what sequence 0 now computes, against the context that wrote the state
                    nxt = p.decode(0, writer["next"][0])
                    base = writer["logits"][0]
                    rec["target_seq0_next_logits_vs_writer"] = (
                        {"bit_identical": bool(np.array_equal(base, nxt.value)),
                         "max_abs_diff": float(np.max(np.abs(base - nxt.value)))}
                        if nxt.ok and nxt.rc == 0 and nxt.value is not None and base is not None
                        else {"decode": nxt.summary(), "rc": nxt.rc})
            else:
                rec["stderr_tail"] = relevant_log(out.stderr)[-4:]
            return rec
        finally:
            p.close()

    def all_cases(self, scen: dict[str, dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """``scen``: per scenario name, {"ctx": CtxParams, "blob0": bytes, "file0": bytes, "layout0": the blob's
        layout, "next": next token per sequence, "logits": the writer's logits for it}."""
        obs: list[dict[str, Any]] = []
        skipped: list[dict[str, Any]] = []
        a = scen["A"]
        blob, seqfile = a["blob0"], a["file0"]
        obs.append(self.run("truncated_1", a["ctx"], blob[:-1], as_file=False, scenario="A", writer=a,
                            mutation={"kind": "truncate", "removed_bytes": 1, "original_size": len(blob)}))
        obs.append(self.run("truncated_100", a["ctx"], seqfile[:-100], as_file=True, scenario="A", writer=a,
                            mutation={"kind": "truncate", "removed_bytes": 100, "original_size": len(seqfile)}))
        if "C" in scen and "D" in scen:
            mut = {"kind": "context", "written_with": "rotation on (scenario C)",
                   "loaded_into": "LLAMA_ATTN_ROT_DISABLE=1 (scenario D)"}
            obs.append(self.run("rot_mismatch", scen["D"]["ctx"], scen["C"]["blob0"], as_file=False,
                                scenario="C->D", writer=scen["C"], mutation=mut))
        else:
            skipped.append({"case": "rot_mismatch", "why": "no quantized attention cache (recurrent state only)"})
        fields = _first_kv_fields(a["layout0"])
        if fields is None:
            skipped.append({"case": "wrong_k_type/wrong_cell_count", "why": "no K or R record in the blob"})
            return obs, skipped
        type_off, count_off = fields
        t_old = struct.unpack_from("<i", blob, type_off)[0]
        t_new = 8 if t_old != 8 else 1
        bad = bytearray(blob)
        struct.pack_into("<i", bad, type_off, t_new)
        obs.append(self.run("wrong_k_type", a["ctx"], bytes(bad), as_file=False, scenario="A", writer=a,
                            mutation={"kind": "field", "offset": type_off, "from": t_old, "to": t_new}))
        c_old = struct.unpack_from("<I", blob, count_off)[0]
        bad = bytearray(blob)
        struct.pack_into("<I", bad, count_off, c_old + 1)
        obs.append(self.run("wrong_cell_count", a["ctx"], bytes(bad), as_file=False, scenario="A", writer=a,
                            mutation={"kind": "field", "offset": count_off, "from": c_old, "to": c_old + 1}))
        return obs, skipped
