"""Which consumer of each pinned build loads a state file: libllama and llama-server answered apart.

libllama (``llama_state_seq_load_file`` / ``llama_state_seq_set_data``) is what
:mod:`kvscope.core.analysis.compat` answers for each layout generation. llama-server's
``/slots/N?action=restore`` (``tools/server/server-context.cpp``, ``SERVER_TASK_TYPE_SLOT_RESTORE``,
the same in both pinned builds) calls ``llama_state_seq_load_file`` and then checks on its own:

* ``llama_state_seq_load_file`` returned 0: "No available space in KV cache or invalid slot save file";
* the packed token list (``server_tokens::deserialize``): "Unsupported server tokens state version",
  "Cannot restore media tokens without an mmproj";
* more tokens than the slot's context: "Restored prompt does not fit in the slot context";
* a token outside ``[0, n_vocab)`` (``server_tokens::validate``): "Invalid tokens in slot save file",
  a file libllama loads without complaint.

Every server refusal is answered as ``Unable to restore slot: <reason>`` (HTTP 400). Each answer is
``loads``, ``refuses`` (with the message), ``crashes`` (the assert) or ``unknown``.

The one crash told from the bytes: ``llama_file::read_raw_unsafe`` (``src/llama-mmap.cpp``, both
builds) reads only what is left of the file and does not fail at its end, while
``llama_io_read_file`` counts every byte asked for. A header of another kind read past the end holds
garbage that its check refuses; but a file cut inside the last loop of records the memory reads (the
V records of the last KV cache, K for a K-only cache, the ``s`` records of the last recurrent state)
reads the rest of that loop's headers into the variables the record before filled, which pass, so
the load "succeeds" with more bytes counted than the file holds and ``llama_state_seq_load_file``
aborts on ``GGML_ASSERT(nread <= state_size)`` (llama-context.cpp), in libllama and llama-server alike.
Bytes after the end of the state are never read by the file API: such a file loads.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from kvscope.core.pinned_builds import BUILDS
from kvscope.core.reader.records import ParseResult

if TYPE_CHECKING:
    from kvscope.core.analysis.compat import GenCompat
    from kvscope.core.model.profile import ModelProfile

SERVER_PREFIX = "Unable to restore slot: "
LOAD_FAILED = "No available space in KV cache or invalid slot save file"
INVALID_TOKENS = "Invalid tokens in slot save file"
DOES_NOT_FIT = "Restored prompt does not fit in the slot context"
NO_MMPROJ = "Cannot restore media tokens without an mmproj"
SERVER_TOKENS_VERSION = 1  # SERVER_TOKENS_STATE_VERSION of both pinned builds


@dataclass
class ConsumerAnswer:
    """What one consumer of one build does with the file."""

    build: str
    consumer: str  # "libllama" | "llama-server"
    answer: str  # "loads" | "refuses" | "crashes" | "unknown"
    message: str  # the refusal as the consumer says it, or why it cannot be told

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def line(self) -> str:
        return f"{self.build} {self.consumer}: {self.answer}" + (f": {self.message}" if self.message else "")


ASSERT_PAST_END = "GGML_ASSERT(nread <= state_size) failed"


# the reader's words for a cut inside a record: "file ends inside the V layer 1 payload", "... s layer 1 header"
_CUT_RE = re.compile(r"file ends inside the (\w) layer \d+ (?:payload|header)")


def reads_past_end(res: ParseResult, profile: ModelProfile | None) -> bool:
    """The file is cut inside the last loop of records its memory reads (the V records of its last KV
    cache, the ``s`` records of its last recurrent state), header or payload: the headers after the cut
    are read past the end, keep the values of the record before (the same variables, the same layer
    types), pass their checks, and the load counts more bytes than the file holds."""
    if res.kind != "seq_file" or profile is None:
        return False
    plan = profile.expected_sections(False)
    if not plan or not plan[-1].layers or plan[-1].kind not in ("kv", "recurrent"):
        return False
    last = plan[-1]
    want = ("k" if last.v_elems == () else "v") if last.kind == "kv" else "s"
    for f in res.findings:
        parts = f.path.strip("/").split("/")
        m = _CUT_RE.search(f.message)
        if f.code == "truncated" and m and len(parts) >= 2 and parts[1] == last.role and m.group(1).lower() == want:
            return True
    return False


# errors libllama's file API never sees: bytes after the end of the state (it stops where the state
# ends), token ids (it copies them without looking: llama-server's validate() is what checks them)
_LIBLLAMA_BLIND = ("trailing_bytes", "token_out_of_vocab")


def _lib_blind(res: ParseResult) -> bool:
    """Every error in the file is one ``llama_state_seq_load_file`` does not check (it loads)."""
    errors = [f for f in res.findings if f.severity == "error"]
    return res.kind == "seq_file" and bool(errors) and all(f.code in _LIBLLAMA_BLIND for f in errors)


def _server(res: ParseResult, profile: ModelProfile | None, lib: ConsumerAnswer, n_ctx: int | None) -> ConsumerAnswer:
    def ans(answer: str, message: str = "") -> ConsumerAnswer:
        return ConsumerAnswer(lib.build, "llama-server", answer, message)

    if res.kind != "seq_file":
        return ans("refuses", f"llama-server restores slot files (sequence files), not a {res.kind}")
    if lib.answer == "crashes":
        return ans("crashes", lib.message)
    if lib.answer == "refuses":
        return ans("refuses", SERVER_PREFIX + LOAD_FAILED)
    payload = res.token_payload or {}
    version = payload.get("version")
    if version is not None and int(version) != SERVER_TOKENS_VERSION:
        return ans("refuses", SERVER_PREFIX + "Unsupported server tokens state version")
    if payload.get("n_media"):
        return ans("unknown", f"the slot holds media chunks: restored only by a server with --mmproj ({NO_MMPROJ} "
                              "without one)")
    tokens = [int(t) for t in res.tokens]
    if n_ctx is not None and len(tokens) > n_ctx:
        return ans("refuses", SERVER_PREFIX + DOES_NOT_FIT)
    if profile is not None and any(t < 0 or t >= profile.n_vocab for t in tokens):
        return ans("refuses", SERVER_PREFIX + INVALID_TOKENS)
    if lib.answer == "unknown":
        return ans("unknown", lib.message)
    if profile is None:
        return ans("unknown", "libllama loads it; whether every token is in the vocabulary needs the model")
    return ans("loads")


def v_trans_mismatch(res: ParseResult, flash_attn: bool | None) -> bool:
    """A KV stream's V transposition is not the context's (``state_read_data``: "incompatible V
    transposition"): a context transposes V exactly when flash attention is off."""
    if flash_attn is None:
        return False
    return any(st.v_trans is not None and bool(st.v_trans) == flash_attn
               for sec in res.sections if sec.kind == "kv" for st in sec.streams if st.cell_count)


def consumer_answers(res: ParseResult, profile: ModelProfile | None = None, compat: list[GenCompat] | None = None,
                     n_ctx: int | None = None, flash_attn: bool | None = None) -> list[ConsumerAnswer]:
    """libllama's and llama-server's answer for each pinned build (``compat``: the per-generation
    answers of :func:`kvscope.core.analysis.compat.compatibility`; ``n_ctx``: the server's slot context;
    ``flash_attn``: the context's, which decides the V transposition it accepts; None: not checked)."""
    by_build = {c.build: c for c in compat or [] if c.build}
    out: list[ConsumerAnswer] = []
    for b in BUILDS:
        c = by_build.get(b.name)
        past_end = reads_past_end(res, profile) and not (c is not None and c.stage == "header")
        if past_end:
            lib = ConsumerAnswer(b.name, "libllama", "crashes", ASSERT_PAST_END + " (llama_state_seq_load_file: "
                                 "the file ends inside its last record, read as if it were whole)")
        elif c is None:
            lib = ConsumerAnswer(b.name, "libllama", "unknown", "no compatibility answer for this build")
        elif (c.loads or (c.stage == "memory" and _lib_blind(res))) and v_trans_mismatch(res, flash_attn):
            lib = ConsumerAnswer(b.name, "libllama", "refuses", "state_read_data: incompatible V transposition")
        elif c.loads or (c.stage == "memory" and _lib_blind(res)):
            lib = ConsumerAnswer(b.name, "libllama", "loads", "")
        elif c.loads is False:
            lib = ConsumerAnswer(b.name, "libllama", "refuses", c.answer)
        else:
            lib = ConsumerAnswer(b.name, "libllama", "unknown", c.answer)
        out += [lib, _server(res, profile, lib, n_ctx)]
    return out
