"""Fresh real llama-server slots of the trained model under settings drawn at random, and verify's answers (#28).

Each case is drawn from its own seed (``--seed`` + the case's number, so ``--start`` runs a batch in parts):
the pinned build; the K and V cache types (f16, q8_0, q4_0, mixed); flash attention; ``--swa-full``;
``-b``/``-ub`` (512/512, 64/32, 32/16) and ``-t`` (1, 2); 1-4 parallel slots (unified KV or not, the others
busy with their own prompts) and which slot is saved; ``-c`` per slot (1024, 2048) with prompts below or past
Gemma 3's 512-token window; ``--cache-reuse`` (0, 64: a later request inserts tokens before a chunk of 64 or
more, so llama-server shifts that chunk); ``--ctx-checkpoints 0``; ``LLAMA_ATTN_ROT_DISABLE=1``; raw
``/completion`` prompts or ``/v1/chat/completions`` with the model's chat template; 1-3 turns into the same
slot (``cache_prompt``); 0-32 generated tokens; prompts from a small multilingual corpus
(``bench/kvharness/corpus.py``: English, French, German, Chinese, code, mixed). A real llama-server writes
the slot (``POST /slots/N?action=save``); ``Verifier(...).run()`` judges it (it must say ``ok``), then a damaged
copy made with the corruption catalog (NaN over a V record's cells, a K record zeroed, or a cell's position
moved) is judged (it must not say ``ok``, and should name the damage).

Prints one JSON line per case and a JSON summary: healthy verdicts (ok/damaged/diverges/stale/other), damaged
copies (named/unnamed/ok), and per setting the cases and healthy slots not called ok. A case whose slot
could not be written (a server that refuses the settings) is counted as ``setup_error``, not as a verdict.

Usage::

    .venv/bin/python bench/fuzz_verify_trained.py --cases 40 --seed 100
    .venv/bin/python bench/fuzz_verify_trained.py --cases 20 --seed 100 --start 20   # the second half
    .venv/bin/python bench/fuzz_verify_trained.py --quick        # 2 cases, fast settings
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from kvscope.core.engine.server import ServerClient, ServerProcess
from kvscope.core.engine.trained_model import require_model
from kvscope.core.lab.damaged_copy import corrupt_file
from kvscope.core.verify.result import VerifyResult
from kvscope.core.verify.run import Verifier

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kvharness.corpus import LANGS, chars_per_token, passage  # noqa: E402

DAMAGES = ("fill:value=nan,role=v,index=1,cells=2-5", "fill:value=zeros,role=k,index=3",
           "set:field=pos,cell=4,value=900")
ROT = "LLAMA_ATTN_ROT_DISABLE"
WINDOW = 512  # Gemma 3's sliding window
# the settings the summary counts by
KEYS = ("build", "types", "fa", "swa_full", "batch", "threads", "n_parallel", "slot", "kv_unified", "ctx_slot",
        "cache_reuse", "ctx_checkpoints", "rot_disable", "mode", "turns", "n_predict", "lang", "past_window")


def draw(rng: random.Random) -> dict[str, Any]:
    types = rng.choice([("f16", "f16"), ("q8_0", "q8_0"), ("q4_0", "q4_0"), ("q8_0", "f16"), ("q4_0", "q8_0")])
    n_par = rng.choice([1, 1, 2, 3, 4])
    b, ub = rng.choice([(512, 512), (64, 32), (32, 16)])
    return {"build": rng.choice(["b11434", "0c1e5709"]), "types": f"{types[0]}/{types[1]}",
            "fa": rng.random() < 0.6 or types[1] != "f16",  # a quantized V cache needs flash attention
            "swa_full": rng.random() < 0.5, "batch": f"{b}/{ub}", "threads": rng.choice([1, 2]),
            "n_parallel": n_par, "slot": rng.randrange(n_par), "kv_unified": n_par > 1 and rng.random() < 0.7,
            "ctx_slot": rng.choice([1024, 1024, 2048]), "cache_reuse": rng.choice([0, 64]),
            "ctx_checkpoints": rng.random() < 0.3, "rot_disable": rng.random() < 0.25,
            "mode": rng.choice(["completion", "completion", "chat"]), "turns": rng.choice([1, 2, 2, 3]),
            "tokens": rng.choice([48, 96, 200, 560, 720]), "n_predict": rng.choice([0, 1, 8, 32]),
            "lang": rng.choice(LANGS), "text_seed": rng.randrange(1 << 30), "damage": rng.choice(DAMAGES)}


def quick(case: dict[str, Any]) -> dict[str, Any]:
    """Fast settings for ``--quick`` (the smoke test): short prompts, few turns and slots, default batches."""
    n_par = min(int(case["n_parallel"]), 2)
    return {**case, "tokens": 48, "turns": min(int(case["turns"]), 2), "n_predict": min(int(case["n_predict"]), 8),
            "n_parallel": n_par, "slot": min(int(case["slot"]), n_par - 1), "batch": "512/512", "threads": 2,
            "ctx_slot": 1024, "kv_unified": bool(case["kv_unified"]) and n_par > 1}


def server_args(case: dict[str, Any]) -> list[str]:
    ctk, ctv = str(case["types"]).split("/")
    b, ub = str(case["batch"]).split("/")
    args = ["-ctk", ctk, "-ctv", ctv, "-fa", "on" if case["fa"] else "off", "--no-warmup", "-b", b, "-ub", ub,
            "--kv-unified" if case["kv_unified"] else "--no-kv-unified", "--cache-reuse", str(case["cache_reuse"])]
    if case["swa_full"]:
        args.append("--swa-full")
    if case["ctx_checkpoints"]:
        args += ["--ctx-checkpoints", "0"]
    return args


def _text_tokens(c: ServerClient, lang: str, rng: random.Random, n: int, special: bool) -> list[int]:
    toks = c.tokenize(passage(lang, rng, int(n * chars_per_token(lang) * 1.3) + 40), add_special=special)
    return toks[:n]


def _generated(c: ServerClient, ans: dict[str, Any]) -> list[int]:
    toks = ans.get("tokens")
    if isinstance(toks, list) and all(isinstance(t, int) for t in toks):
        return toks
    content = ans.get("content")
    return c.tokenize(content, add_special=False) if isinstance(content, str) and content else []


def _completion_turns(c: ServerClient, case: dict[str, Any], rng: random.Random, slot: int, room: int,
                      busy: list[int]) -> None:
    """1-3 ``/completion`` requests into ``slot``, each continuing the last (a request that would not fit in
    ``room`` tokens is not made). With ``--cache-reuse`` a later request inserts new tokens before the last 64+
    tokens, which llama-server then reuses shifted."""
    lang, n_pred = str(case["lang"]), int(case["n_predict"])
    kw = {"id_slot": slot, "temperature": 0.0, "return_tokens": True}
    history = _text_tokens(c, lang, rng, int(case["tokens"]), True)
    history += _generated(c, c.complete(history, n_predict=n_pred, **kw))
    for _ in range(int(case["turns"]) - 1):
        if busy:  # another slot's request between the turns: its cells land among this slot's (unified KV)
            c.complete(_text_tokens(c, lang, rng, rng.randint(16, 64), True), n_predict=2, id_slot=rng.choice(busy))
        more = _text_tokens(c, rng.choice(LANGS), rng, rng.randint(16, 96), False)
        if case["cache_reuse"] and len(history) >= 96:
            k = len(history) - rng.randint(64, min(len(history) - 16, 200))
            nxt = history[:k] + more + history[k:]
        else:
            nxt = history + more
        if len(nxt) + n_pred > room:
            break
        history = nxt + _generated(c, c.complete(nxt, n_predict=n_pred, **kw))


def _chat_turns(c: ServerClient, case: dict[str, Any], rng: random.Random, slot: int, room: int,
                busy: list[int]) -> None:
    """1-3 ``/v1/chat/completions`` requests into ``slot`` (the model's chat template), each the conversation
    so far plus a new user message."""
    lang, n_pred = str(case["lang"]), max(1, int(case["n_predict"]))
    cpt = chars_per_token(lang)
    msgs = [{"role": "user", "content": passage(lang, rng, int(int(case["tokens"]) * cpt))}]
    used = int(case["tokens"])
    for turn in range(int(case["turns"])):
        if turn:
            if busy:
                c.complete(_text_tokens(c, lang, rng, rng.randint(16, 64), True), n_predict=2,
                           id_slot=rng.choice(busy))
            n_new = rng.randint(16, 96)
            if used + n_new + n_pred + 16 > room:
                break
            used += n_new + n_pred + 16
            msgs.append({"role": "user", "content": passage(rng.choice(LANGS), rng, int(n_new * cpt))})
        ans = c.request("POST", "/v1/chat/completions", {"messages": msgs, "max_tokens": n_pred, "id_slot": slot,
                                                         "cache_prompt": True, "temperature": 0.0})
        reply = ans["choices"][0]["message"].get("content") or ""
        msgs.append({"role": "assistant", "content": reply})


def write_slot(model: Path, case: dict[str, Any], folder: Path) -> tuple[Path, int]:
    n_par, slot, ctx_slot = int(case["n_parallel"]), int(case["slot"]), int(case["ctx_slot"])
    rng = random.Random(int(case["text_seed"]))
    env = {ROT: "1"} if case["rot_disable"] else {}
    with ServerProcess(model, build=str(case["build"]), n_ctx=ctx_slot * n_par, n_parallel=n_par, slot_dir=folder,
                       args=server_args(case), threads=int(case["threads"]), env=env, timeout_s=180.0) as srv:
        c = srv.client(timeout_s=600.0, max_requests=200)
        busy = [s for s in range(n_par) if s != slot]
        for s in busy:  # the other slots hold their own prompts first
            c.complete(_text_tokens(c, rng.choice(LANGS), rng, rng.randint(24, 160), True), n_predict=4, id_slot=s)
        room = ctx_slot - 48
        turns = _chat_turns if case["mode"] == "chat" else _completion_turns
        turns(c, case, rng, slot, room, busy)
        saved = c.slot_save(slot, "slot.bin")
    return folder / "slot.bin", int(saved["n_saved"])


def named(damage: str, res: VerifyResult) -> bool:
    """Whether verify's answer names the damage made: the record role and kind, or the cells (a position)."""
    if res.verdict == "ok":
        return False
    if res.restore is not None and not res.restore.ok:
        return True  # llama.cpp refused the file: the refusal is the reason given
    found = res.damage()
    if damage.startswith("set:field=pos"):
        return any(d.get("cells_missing") or d.get("cells_extra") for d in found)
    role = "v" if "role=v" in damage else "k"
    status = ("nonfinite",) if "value=nan" in damage else ("differs", "nonfinite")
    return any(d.get("role") == role and d.get("status") in status for d in found)


def judge(slot: Path, model: Path, build: str) -> tuple[str, VerifyResult | None, str]:
    try:
        res = Verifier(str(slot), str(model), engine="llama.cpp", build=build).run()
    except Exception as e:  # noqa: BLE001 (a verify that fails is a finding, not the end of the batch)
        return "error", None, f"{type(e).__name__}: {e}"[:240]
    return res.verdict, res, (res.reasons or [""])[0][:240]


def run_case(model: Path, case: dict[str, Any], folder: Path) -> dict[str, Any]:
    t0 = time.monotonic()
    row: dict[str, Any] = dict(case)
    try:
        slot, n_saved = write_slot(model, case, folder)
    except Exception as e:  # noqa: BLE001 (a server refusing the settings: recorded, not judged)
        row.update(healthy="setup_error", damaged="setup_error", why_setup=f"{type(e).__name__}: {e}"[:300],
                   seconds=round(time.monotonic() - t0, 1))
        return row
    row["n_saved"] = n_saved
    row["past_window"] = n_saved > WINDOW
    verdict, res, why = judge(slot, model, str(case["build"]))
    row.update(healthy=verdict, why_healthy=why)
    if res is not None:
        env = dict(res.context.get("ctx", {}).get("env") or [])
        row["verify_rot_disable"] = env.get(ROT) == "1"
        if verdict != "ok":
            row["healthy_damage"] = res.damage()[:4]
            beh = res.behaviour.to_json() if res.behaviour is not None else {}
            row["healthy_behaviour"] = {k: beh.get(k) for k in ("first_step_beyond", "spread_kl", "limit_kl")}
    damaged_path = folder / "damaged.bin"
    corrupt_file(slot, damaged_path, [str(case["damage"])], model=str(model))
    dverdict, dres, dwhy = judge(damaged_path, model, str(case["build"]))
    row.update(damaged=dverdict, damage_named=dres is not None and named(str(case["damage"]), dres),
               why_damaged=dwhy[:160], seconds=round(time.monotonic() - t0, 1))
    return row


def summary(rows: list[dict[str, Any]], a: argparse.Namespace) -> dict[str, Any]:
    healthy = Counter(r["healthy"] if r["healthy"] in ("ok", "damaged", "diverges", "stale", "setup_error")
                      else "other" for r in rows)
    judged = [r for r in rows if r["healthy"] != "setup_error"]
    damaged = Counter("ok" if r["damaged"] == "ok" else "named" if r.get("damage_named") else "unnamed"
                      for r in judged)
    by: dict[str, dict[str, dict[str, int]]] = {}
    for r in judged:
        for k in KEYS:
            cell = by.setdefault(k, {}).setdefault(str(r.get(k)), {"cases": 0, "healthy_not_ok": 0, "missed": 0})
            cell["cases"] += 1
            cell["healthy_not_ok"] += r["healthy"] != "ok"
            cell["missed"] += r["damaged"] == "ok"
    false = [{k: r.get(k) for k in ("case", *KEYS, "n_saved", "healthy", "why_healthy")}
             for r in judged if r["healthy"] != "ok"]
    return {"cases": len(rows), "seed": a.seed, "start": a.start, "healthy": dict(healthy), "damaged": dict(damaged),
            "healthy_not_ok": sum(r["healthy"] != "ok" for r in judged),
            "damaged_called_ok": sum(r["damaged"] == "ok" for r in judged),
            "setup_errors": healthy.get("setup_error", 0), "false_verdicts": false, "by_setting": by,
            "seconds": round(sum(r["seconds"] for r in rows), 1)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", type=int, default=12)
    p.add_argument("--seed", type=int, default=28)
    p.add_argument("--start", type=int, default=0, help="the first case's number (case i is drawn from seed+i)")
    p.add_argument("--max-seconds", type=float, default=0.0, help="start no case after this many seconds (0: none)")
    p.add_argument("--quick", action="store_true", help="2 cases, fast settings")
    a = p.parse_args(argv)
    n = 2 if a.quick else a.cases
    model = require_model()
    rows: list[dict[str, Any]] = []
    t_start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="kvscope-fuzz-verify-") as tmp:
        for i in range(a.start, a.start + n):
            if a.max_seconds and time.monotonic() - t_start > a.max_seconds:
                break
            case = draw(random.Random(a.seed + i))
            if a.quick:
                case = quick(case)
            folder = Path(tmp) / f"case{i}"
            folder.mkdir()
            row = {"case": i, **run_case(model, case, folder)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    s = summary(rows, a)
    print(json.dumps(s))
    return 0 if s["healthy_not_ok"] == 0 and s["damaged_called_ok"] == 0 and not s["setup_errors"] else 1


if __name__ == "__main__":
    sys.exit(main())
