"""Will llama-server reuse a restored slot, or re-process its whole prompt? The prediction, from the file alone.

A restore can succeed (HTTP 200, ``n_restored`` full) and still be useless: the next request then
re-processes every token. The rule is llama-server's, read from ``tools/server/server-context.cpp``
of both pinned builds (the same in both; ``update_slots``, the ``SLOT_STATE_STARTED`` branch):

1. ``n_past`` = the common prefix of the slot's tokens and the new prompt (``cache_prompt`` on, the
   default). For a prompt that continues the slot's own tokens that is every restored token.
   ``--cache-reuse`` only shifts chunks *after* a mismatch, so it adds nothing to such a prompt.
2. ``n_swa`` = the model's sliding window, or 0 with ``--swa-full`` (and 0 for a model without SWA:
   the server turns ``--swa-full`` off there).
3. ``pos_min_thold = max(0, n_past - n_swa - (0 if the prompt has new tokens else 1))``, and
   ``pos_min = llama_memory_seq_pos_min``: the memory's first position for the sequence (an iSWA cache
   answers with its SWA cache's, a hybrid with the larger of its two parts', a recurrent state with
   its one cell's, the last token's, DeepSeek-V4's cache with its raw cache's *last* position; the
   server's ``n_swa`` is 0 for DeepSeek-V4 too, ``llama_model_n_swa``).
4. If ``pos_min >= pos_min_thold``, the memory cannot serve ``n_past`` tokens by itself and the server
   looks for a *context checkpoint*. A restored slot has none (``/slots?action=restore`` clears them and
   the save file holds none), so it logs "forcing full prompt re-processing due to lack of cache data"
   and sets ``n_past = 0``.

So, for the prompt "the slot's tokens plus new ones": a plain KV cache is reused in full; an iSWA
cache without ``--swa-full`` is re-processed in full whenever its SWA cells start within ``n_swa`` of
the end, which they do in every save measured (the SWA cache saves only the cells inside the window,
whether the writer ran with ``--swa-full`` or not: Gemma 3 270M, 607 tokens, both builds); with
``--swa-full`` on the restoring server it is reused in full. A recurrent or hybrid memory is reused
when the prompt extends the *whole* slot (its state sits at the last token), and re-processed in
full for any prompt that diverges before the end (no checkpoint to roll back to).

Before that, ``/slots/N?action=restore`` itself must accept the file: ``llama_state_seq_load_file``
(the layout, :mod:`kvscope.core.analysis.compat`), then "Restored prompt does not fit in the slot
context" (more tokens than the slot's ``n_ctx``) and "Invalid tokens in slot save file" (a token
outside ``[0, n_vocab)``). :func:`predict_reuse` answers per pinned build and ``--swa-full`` setting;
:mod:`kvscope.core.verify.reuse` measures the same on a real server.

After step 4, a slot the server keeps is continued at position ``n_past``: it removes the cells from
``n_past`` on (``seq_rm``) and decodes the new tokens there, and ``llama_decode`` requires the memory's
last position to be ``n_past - 1``. A slot whose token list and cells disagree
(:mod:`kvscope.core.reader.token_cells`: a token list longer than its cells, cells shifted or missing)
therefore either fails that request (HTTP 500 "Invalid input batch.": measured on b11434's llama-server
with ``--swa-full``, a Gemma 3 slot with one token appended) or is continued without an error from a
cache that does not hold its tokens at their positions (every position moved by one: the server reports
the whole slot as cached).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from kvscope.core.analysis.slot_tokens import first_outside_vocab, holds_media, token_array
from kvscope.core.pinned_builds import BUILDS
from kvscope.core.reader.records import ParseResult
from kvscope.core.reader.token_cells import CODE as TOKEN_CELL_CODE
from kvscope.core.reader.token_cells import agreement, memory_pos_max_before

if TYPE_CHECKING:
    from kvscope.core.analysis.compat import GenCompat
    from kvscope.core.analysis.consumers import ConsumerAnswer
    from kvscope.core.model.profile import ModelProfile

FORCED_RESET = ("forcing full prompt re-processing due to lack of cache data (likely due to SWA or "
                "hybrid/recurrent memory)")  # llama-server's log line, without its link
INVALID_TOKENS = "Unable to restore slot: Invalid tokens in slot save file"
DOES_NOT_FIT = "Unable to restore slot: Restored prompt does not fit in the slot context"
INVALID_BATCH = "Invalid input batch."  # llama-server's HTTP 500 when llama_decode returns -1
RESAVE = "re-save the slot from a server that holds it, or rebuild it from its tokens (`kvscope repair`)"


@dataclass(frozen=True)
class ServerSettings:
    """The llama-server settings that decide reuse. ``n_ctx``: the slot's context (None: not checked)."""

    swa_full: bool = False
    cache_prompt: bool = True
    n_ctx: int | None = None


@dataclass
class ReusePrediction:
    """What one llama-server does with the slot on the next prompt that continues its tokens.

    ``restores``: the restore succeeds (None: cannot be told); ``reused_tokens`` of the
    ``restored_tokens`` are kept and ``reprocessed_tokens`` of them computed again (None: cannot be
    told); ``reason`` in llama-server's words where it has them; ``fix``: what would make it reusable.
    """

    build: str | None
    swa_full: bool
    restores: bool | None
    restored_tokens: int
    reused_tokens: int | None
    reprocessed_tokens: int | None
    reason: str
    fix: str | None = None
    fails: bool = False  # the slot restores, but the next request that continues it fails (HTTP 500)
    crashes: bool = False  # the restore aborts the server (an assert: ``reason``)

    @property
    def wasted(self) -> bool:
        """The slot restores but none of it is reused."""
        return bool(self.restores) and self.reused_tokens == 0 and self.restored_tokens > 0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def line(self) -> str:
        """One line for the text outputs."""
        who = f"llama-server {self.build}" if self.build else "llama-server"
        who += " --swa-full" if self.swa_full else ""
        if self.crashes:
            return f"{who}: crashes restoring the slot: {self.reason}"
        if self.restores is False:
            return f"{who}: refuses the slot: {self.reason}" + (f" (fix: {self.fix})" if self.fix else "")
        if self.fails:
            return f"{who}: restores, but the next request fails: {self.reason}" + (
                f" (fix: {self.fix})" if self.fix else "")
        if self.reused_tokens is None:
            return f"{who}: reuse cannot be told: {self.reason}"
        if self.reused_tokens == 0 and self.restored_tokens:
            text = f"{who}: restores, but re-processes all {self.restored_tokens} tokens: {self.reason}"
        else:
            text = f"{who}: reuses {self.reused_tokens} of {self.restored_tokens} tokens: {self.reason}"
        return text + (f" (fix: {self.fix})" if self.fix else "")


def memory_pos_min(res: ParseResult) -> int | None:
    """``llama_memory_seq_pos_min`` of the restored memory: the largest of its parts' first cell
    positions (an iSWA's base cache is a superset of its SWA cache, so this is the SWA cache's); -1
    for a memory with no cell, None when the file holds no cell table."""
    if _is_dsv4(res):
        # llama_kv_cache_dsv4::seq_pos_min answers with its raw cache's seq_pos_max: the compressed
        # state cannot be rolled back inside the window, so only the end counts
        ends = [int(st.cells.pos.max()) for sec in res.sections if sec.role.startswith("kv_raw")
                for st in sec.streams if st.cells is not None and st.cells.count]
        return max(ends) if ends else -1
    mins: list[int] = []
    seen = False
    for sec in res.sections:
        tables = [st.cells for st in sec.streams] if sec.kind == "kv" else [sec.cells]
        part: list[int] = []
        for t in tables:
            if t is None:
                continue
            seen = True
            if t.count:
                part.append(int(t.pos.min()))
        if part:
            mins.append(min(part))
        elif any(t is not None for t in tables):
            mins.append(-1)
    if not seen:
        return None
    return max(mins) if mins else -1


def _is_dsv4(res: ParseResult) -> bool:
    return any(sec.kind == "dsv4_header" for sec in res.sections)


def _has_swa(res: ParseResult, profile: ModelProfile | None) -> bool:
    """The server's ``n_swa`` is not 0: ``llama_model_n_swa`` (0 for DeepSeek-V4, whose raw SWA cache
    cannot serve a rollback, in both pinned builds) and ``--swa-full`` off."""
    if _is_dsv4(res) or (profile is not None and profile.memory_class == "dsv4"):
        return False
    has_swa_cache = any(sec.role.endswith("_swa") for sec in res.sections)
    if profile is not None:
        return has_swa_cache and profile.n_swa > 0 and bool(profile.swa_layers)
    return has_swa_cache


def _has_recurrent(res: ParseResult) -> bool:
    return any(sec.kind == "recurrent" for sec in res.sections)


def predict_one(res: ParseResult, profile: ModelProfile | None, settings: ServerSettings,
                build: str | None = None, load_refusal: str | None = None,
                loads: bool | None = True, tokens: npt.NDArray[np.int64] | None = None,
                launch_env: str | None = None, server: ConsumerAnswer | None = None) -> ReusePrediction:
    """The prediction for one server (``loads``/``load_refusal``: what its libllama does with the layout on a
    default launch; ``launch_env``: the environment under which it loads it instead, ``LLAMA_ATTN_ROT_DISABLE=1``;
    ``tokens``: the file's tokens as :func:`~kvscope.core.analysis.slot_tokens.token_array`, when the caller
    has them; ``server``: this build's llama-server answer of :func:`~kvscope.core.analysis.consumers.
    consumer_answers`, whose restore answer the prediction keeps: the builds table and the reuse line say the
    same)."""
    tokens = token_array(res.tokens) if tokens is None else tokens
    n = int(tokens.size)

    def out(restores: bool | None, reused: int | None, reason: str, fix: str | None = None) -> ReusePrediction:
        reproc = None if reused is None else n - reused
        return ReusePrediction(build, settings.swa_full, restores, n, reused, reproc, reason, fix)

    if res.kind != "seq_file":
        return out(False, 0, f"llama-server restores slot files (sequence files), not a {res.kind}")
    says = server.answer if server is not None else None
    if says == "crashes" and server is not None:
        return ReusePrediction(build, settings.swa_full, False, n, 0, None, server.message, crashes=True)
    if loads is False and says in (None, "refuses"):
        return out(False, 0, f"Unable to restore slot: No available space in KV cache or invalid slot save file "
                             f"(libllama: {load_refusal})" if load_refusal else "the layout does not load",
                   f"start llama-server with {launch_env}" if launch_env else None)
    if holds_media(tokens) or (res.token_payload or {}).get("n_media"):
        return out(None, None, "the slot holds media chunks: its restore needs the server's --mmproj, "
                               "and cache reuse is not predicted for them")
    if says == "unknown" and server is not None:
        return out(None, None, f"whether it restores the slot is unknown: {server.message}")
    if settings.n_ctx is not None and n > settings.n_ctx:
        return out(False, 0, DOES_NOT_FIT, f"start llama-server with a slot context of at least {n} tokens")
    bad = first_outside_vocab(tokens, profile.n_vocab) if profile is not None else None
    if profile is not None and bad is not None:
        return out(False, 0, f"{INVALID_TOKENS} (token {bad} is outside the model's {profile.n_vocab}-token "
                             "vocabulary)", "none: the file's tokens are not this model's")
    n_errors = sum(1 for f in res.findings if f.severity == "error" and f.code != TOKEN_CELL_CODE)
    if n_errors:  # a token list that disagrees with the cells restores: what follows is answered below
        return out(None, None, f"the reader found {n_errors} error(s) in the file: whether llama-server "
                               "restores it is for `kvscope verify --engine server` to tell")
    restores: bool | None = True if loads else None
    if n == 0:
        return out(restores, 0, "the slot holds no tokens: nothing to reuse")
    if not settings.cache_prompt:
        return out(restores, 0, "cache_prompt is off: the server removes every previous token",
                   "send requests with cache_prompt: true (the default)")
    pos_min = memory_pos_min(res)
    if pos_min is None or pos_min < 0:
        return out(restores, None, "the file holds no cell table to tell the memory's first position")
    swa = _has_swa(res, profile)
    if swa and not settings.swa_full and profile is None:
        return out(restores, None, "the sliding window decides it: give the model (--model) for its size")
    n_swa = profile.n_swa if (swa and not settings.swa_full and profile is not None) else 0
    n_past = n  # a prompt that continues the slot's tokens
    thold = max(0, n_past - n_swa)  # the prompt has new tokens
    window = None if profile is None else (profile.n_swa > 0 and bool(profile.swa_layers))
    found = agreement(res, window)
    if found is not None and found.agrees:
        found = None
    if pos_min >= thold:
        if swa and not settings.swa_full:
            why = (f"{FORCED_RESET}: the sliding-window cache starts at position {pos_min}, within the "
                   f"{n_swa}-token window of the slot's end ({n_past}), and the context checkpoints that "
                   "would serve it are not in the save file")
            fix = "start llama-server with --swa-full (the whole SWA cache is kept and the slot is reused)"
        elif _has_recurrent(res) or _is_dsv4(res):
            what = "recurrent" if _has_recurrent(res) else "compressed"
            why = (f"{FORCED_RESET}: the {what} state is at position {pos_min}, past the prompt's "
                   f"common prefix ({n_past}), and the save file holds no checkpoint to roll back to")
            fix = "none: only a prompt that extends the slot's whole token list reuses a recurrent state"
        else:
            why = (f"{FORCED_RESET}: the memory starts at position {pos_min}, not below {thold}, "
                   "and the save file holds no context checkpoint")
            fix = None
        if found is not None:  # re-processed in full, which works; a slot kept as it is would not
            fix = RESAVE
        return out(restores, 0, why, fix)
    if found is not None:
        end = memory_pos_max_before(res, n)
        what = "; ".join(f"{p.section.role}: {w}" for p, w in found.problems)
        if 0 <= end != n - 1:
            why = (f"it continues the slot at position {n_past} while the memory ends at {end} (the token list "
                   f"and the cells disagree: {what}): llama_decode rejects the batch (\"inconsistent sequence "
                   f"positions\") and the server answers HTTP 500 \"{INVALID_BATCH}\"")
            return ReusePrediction(build, settings.swa_full, restores, n, 0, None, why, RESAVE, fails=True)
        why = (f"the server keeps the {n} restored tokens and continues at position {n_past} without an error, but "
               f"the cells do not hold them at their positions ({what}): the continuation is computed from a "
               "misplaced cache")
        return out(restores, n, why, RESAVE)
    if swa and settings.swa_full:
        why = f"--swa-full keeps the whole sliding-window cache: the {n} restored tokens are reused"
    elif swa:
        why = (f"the sliding-window cache reaches back to position {pos_min}, more than the {n_swa}-token "
               f"window before the slot's end: the {n} restored tokens are reused")
    elif _has_recurrent(res) or _is_dsv4(res):
        what = "recurrent" if _has_recurrent(res) else "compressed (DeepSeek-V4)"
        why = (f"the {what} state sits at the slot's last token (position {pos_min}): a prompt that "
               f"extends all {n} tokens reuses them; one that diverges earlier is re-processed in full "
               "(no checkpoint is saved with the slot)")
    else:
        why = f"the KV cache holds every position from {pos_min}: the {n} restored tokens are reused"
    return out(restores, n, why)


def predict_reuse(res: ParseResult, profile: ModelProfile | None = None,
                  compat: list[GenCompat] | None = None, n_ctx: int | None = None,
                  consumers: list[ConsumerAnswer] | None = None) -> list[ReusePrediction]:
    """One prediction per pinned llama-server build x ``--swa-full`` off/on (``inspect --json``'s
    ``reuse_prediction``); ``compat`` (which layout generations load the file) gives each build's libllama answer,
    ``consumers`` (:func:`~kvscope.core.analysis.consumers.consumer_answers`' of the same file; worked out here
    when not given) each build's llama-server answer to the restore, which the prediction follows."""
    from kvscope.core.analysis.consumers import consumer_answers

    by_build = {c.build: c for c in compat or [] if c.build}
    if consumers is None:
        consumers = consumer_answers(res, profile, compat, n_ctx) if compat is not None else []
    servers = {a.build: a for a in consumers if a.consumer == "llama-server"}
    tokens = token_array(res.tokens)
    out = []
    for b in BUILDS:
        c = by_build.get(b.name)
        loads = c.loads if c is not None else None
        refusal = c.answer if c is not None and c.loads is False else None
        env = c.launch_env if c is not None and c.launch_answer == "loads" else None
        for swa_full in (False, True):
            out.append(predict_one(res, profile, ServerSettings(swa_full=swa_full, n_ctx=n_ctx), b.name,
                                   refusal, loads, tokens, env, servers.get(b.name)))
    return out


def reuse_json(entries: list[ReusePrediction]) -> list[dict[str, Any]]:
    return [e.to_json() for e in entries]
