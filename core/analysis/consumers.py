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

A file cut short (:func:`cut_file_answer`, checked against both builds at every record boundary and
inside every header and payload of every memory class): ``llama_file::read_raw_unsafe``
(``src/llama-mmap.cpp``, both builds) reads only what is left of the file and does not fail at its end,
while ``llama_io_read_file`` counts every byte asked for, so each field read after the cut keeps what its
variable held. Inside a loop of records that is the record before's value (the same loop-local): the
rest of the loop passes where its records are alike, and a load that reads nothing else past the end
"succeeds" with more bytes counted than the file holds and aborts on ``GGML_ASSERT(nread <= state_size)``
(llama-context.cpp), in libllama and llama-server alike: a cut inside the last loop of records the
memory reads, past the first record's header (the last KV cache's V records, K for a K-only cache, the
``s`` records of the last recurrent state, the last DeepSeek-V4 compressor layer's score payload). Any
other field read past the end (a loop's first record, the next loop, stream or cache, cell metadata,
headers) holds what the stack held: ``unknown``, which both builds answer either way depending on the
cut. llama-server reads the token count first and refuses a file that ends inside its token array.
A blob (``llama_state_seq_set_data``) is read from a buffer that throws at its end: a cut blob is
refused. Bytes after the end of the state are never read by the file API: such a file loads.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kvscope.core import ggml_types as gt
from kvscope.core.analysis.slot_tokens import first_outside_vocab, token_array
from kvscope.core.pinned_builds import BUILDS
from kvscope.core.reader.layouts import generation_named
from kvscope.core.reader.records import ParseResult

if TYPE_CHECKING:
    from kvscope.core.analysis.compat import GenCompat
    from kvscope.core.model.memory_plan import ExpectedSection
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
    # llama-server only: its answer is libllama's (it restores through the same llama_state_seq_load_file) and
    # not one of its own checks'; and its answer were libllama to load the file (None: libllama loads it)
    follows_lib: bool = field(default=False, compare=False)
    if_lib_loads: tuple[str, str] | None = field(default=None, compare=False)

    def to_json(self) -> dict[str, Any]:
        return {"build": self.build, "consumer": self.consumer, "answer": self.answer, "message": self.message}

    def line(self) -> str:
        return f"{self.build} {self.consumer}: {self.answer}" + (f": {self.message}" if self.message else "")


ASSERT_PAST_END = "GGML_ASSERT(nread <= state_size) failed"


# the reader's words for where a truncated file ends (core/reader: tensor_records, recurrent_section,
# dsv4_section): "file ends inside the V layer 1 header: ...", "... the s layer 0 payload: ...", with the
# section where it is not a plain kv cache (record_names.finding_name: "... the kv_idx K layer 0 payload",
# "... the kv_swa K #1 header" without a model), "... the compressor score payload of layer 2: ..."
_RECORD_CUT = re.compile(r"file ends inside the (?:\w+ )?(?:stream \d+ )?(\w) (?:layer \d+|record \d+|#\d+) "
                         r"(header|payload)")
_DSV4_CUT = re.compile(r"file ends inside the compressor (kv|score) (payload|record header)")
_WHAT = re.compile(r"file ends inside (.*?):")
F32 = 0  # GGML_TYPE_F32: recurrent r/s rows
_WORD = {"k": "K", "v": "V", "r": "r", "s": "s", "p": "p"}


@dataclass(frozen=True)
class CutAnswer:
    """What libllama's file reader does with a sequence file cut inside its memory state."""

    answer: str  # "crashes" | "refuses" | "unknown"
    message: str


# (name, size, llama.cpp's word for it) of the header fields of one record, in read order
_FIELDS = {
    "k": (("type", 4, "key type"), ("row", 8, "key row size")),
    "v": (("type", 4, "value type"), ("row", 8, "value row size")),
    "vt": (("type", 4, "value type"), ("el", 4, "value element size"), ("n_embd", 4, "GQA embedding size")),
    "r": (("type", 4, "r type"), ("row", 8, "r row size")),
    "p": (("row", 8, "ple row size"),),
    "s": (("type", 4, "s type"), ("row", 8, "s row size")),
}


@dataclass(frozen=True)
class _Rec:
    """One record of a read loop as llama.cpp expects it: its header fields and its layer."""

    kind: str  # a key of _FIELDS
    il: int
    values: tuple[int, ...]  # the expected value of each field of _FIELDS[kind]

    def field_bytes(self, i: int) -> bytes:
        size = _FIELDS[self.kind][i][1]
        return (self.values[i] & ((1 << (8 * size)) - 1)).to_bytes(size, "little")


def _unknown(where: str) -> CutAnswer:
    return CutAnswer("unknown", f"{where}: what follows is read past the end into variables this load never set "
                                "(whatever the stack held), so whether llama.cpp refuses it or aborts on "
                                "GGML_ASSERT(nread <= state_size) depends on the build, not on the bytes")


def _kv_loops(sec: ExpectedSection, profile: ModelProfile, k_type: int | None, v_type: int | None,
              v_trans: bool) -> list[list[_Rec]]:
    """The K and V record loops of one stream of a KV cache (``state_read_data``), as expected."""
    k_el = list(sec.k_elems) if sec.k_elems is not None else [profile.n_embd_k_gqa(il) for il in sec.layers]
    if sec.v_elems is not None:
        v_layers = list(zip(sec.layers, sec.v_elems, strict=False))
    else:
        v_layers = [(il, profile.n_embd_v_gqa(il)) for il in sec.layers if profile.has_v(il)]
    # a type not read (None): the loop is there, its values are not known (-1 matches no field)
    k = [_Rec("k", il, (k_type, gt.row_size(k_type, n)) if k_type is not None else (-1, -1))
         for il, n in zip(sec.layers, k_el, strict=True)]
    if v_type is None:
        v = [_Rec("v", il, (-1, -1)) for il, _ in v_layers]
    elif v_trans:
        v = [_Rec("vt", il, (v_type, gt.type_size(v_type), n)) for il, n in v_layers]
    else:
        v = [_Rec("v", il, (v_type, gt.row_size(v_type, n))) for il, n in v_layers]
    return [k, v]


def _recurrent_loops(sec: ExpectedSection, profile: ModelProfile) -> list[list[_Rec]]:
    """The r (with its PLE p records) and s loops of ``llama_memory_recurrent::state_read_data``."""
    r: list[_Rec] = []
    for il in sec.layers:
        r.append(_Rec("r", il, (F32, gt.row_size(F32, profile.n_embd_r))))
        if profile.n_embd_p and il in profile.ple_layers:
            r.append(_Rec("p", il, (4 * profile.n_embd_p,)))
    return [r, [_Rec("s", il, (F32, gt.row_size(F32, profile.n_embd_s))) for il in sec.layers]]


def _cut_record_type(res: ParseResult, path: str) -> int | None:
    """The ggml type in the header of the record cut in its payload (the reader keeps it as the header
    node's value, "f16 row=256"), which it does not list among the section's records."""
    node = res.root
    for name in path.strip("/").split("/"):
        node = next((c for c in node.children if c.name == name), None)  # type: ignore[assignment]
        if node is None:
            return None
    hdr = next((c for c in node.children if c.kind == "layer_header"), None)
    if hdr is None or not isinstance(hdr.value, str):
        return None
    try:
        return gt.type_id_from_name(hdr.value.split()[0])
    except (KeyError, ValueError):
        return None


def _replay(loop: list[_Rec], j: int, field: int, present: int, where: str) -> CutAnswer | None:
    """Read the rest of ``loop`` past the end: the file ends ``present`` bytes into field ``field`` of
    record ``j`` (``field == len(fields)``: inside its payload). A field read past the end keeps the
    value its variable holds: the same field of the record before in this loop (a loop-local of the same
    iteration body, written by the previous iteration), or nothing (the loop's first record). None: every
    check passes to the end of the loop; else the refusal, or unknown."""
    held: dict[tuple[str, str], bytes] = {}
    for rec in loop[:j]:
        for i, (name, _, _) in enumerate(_FIELDS[rec.kind]):
            held[(rec.kind, name)] = rec.field_bytes(i)
    for n, rec in enumerate(loop[j:], start=j):
        fields = _FIELDS[rec.kind]
        for i, (name, _, word) in enumerate(fields):
            want = rec.field_bytes(i)
            if n == j and i < field:
                got: bytes | None = want  # read whole from the file
            else:
                keep = present if (n == j and i == field) else 0
                old = held.get((rec.kind, name))
                got = None if old is None else want[:keep] + old[keep:]
            if got is None:
                return _unknown(where)
            held[(rec.kind, name)] = got
            if got != want:
                value = int.from_bytes(got, "little", signed=name == "type")
                return CutAnswer("refuses", f"state_read_data: mismatched {word} ({rec.values[i]} != {value}, "
                                            f"layer {rec.il}) ({where}: the fields after it keep the record "
                                            "before's values)")
    return None


def cut_file_answer(res: ParseResult, profile: ModelProfile | None) -> CutAnswer | None:
    """libllama's answer to a sequence file cut short, from llama.cpp's read path (None: the file is not
    cut, or it has other errors, which :mod:`compat` answers).

    ``llama_file::read_raw_unsafe`` reads what is left and copies nothing at the end, without failing;
    ``llama_io_read_file`` counts every byte asked for. So every field read after the cut keeps what its
    variable held. Within a loop of records (the K, then V records of a KV stream; the r (and PLE p), then s
    records of a recurrent state; the layers of the last DeepSeek-V4 compressor block) a field of a later
    record is the same loop-local the record before filled: it passes when the record expected has the same
    type and size, and is refused with llama.cpp's message when it does not. Any other field read after the
    cut (a loop's first record, the next loop, stream or cache, the cell metadata, stream and section
    headers, a function called afresh) holds whatever the stack held: ``unknown``. A load whose reads past
    the end all pass has counted more bytes than the file holds and aborts on
    ``GGML_ASSERT(nread <= state_size)``."""
    if res.kind != "seq_file" or profile is None:
        return None
    errors = [f for f in res.findings if f.severity == "error"]
    # cut exactly where a record would start: the reader's missing_layer at the end (the bytes cannot tell a
    # record dropped at the end from a cut file; llama.cpp reads both alike, past the end)
    boundary = next((w for w in res.findings if w.code == "missing_layer" and w.offset == res.size), None)
    if len(errors) > 1 or (errors and errors[0].code != "truncated" and errors[0] is not boundary):
        return None
    if not errors or errors[0] is boundary:
        if boundary is None:
            return None
        f = boundary
        if boundary.extra.get("role") not in _WORD:
            return _unknown("the file ends where a record would start")
        where = f"the file ends where a {_WORD[str(f.extra['role'])]} record would start"
    else:
        f = errors[0]
        m_what = _WHAT.search(f.message)
        where = f"the file ends inside {m_what.group(1) if m_what else 'its memory state'}"
    if res.memory_offset is None or f.offset < res.memory_offset:
        return _unknown(where)
    parts = f.path.strip("/").split("/")
    gen = generation_named(res.layout.name)
    plan = profile.expected_sections(False, bool(gen and gen.kv_rot))
    roles = [s.role for s in plan]
    if len(parts) < 2 or parts[0] != "memory" or parts[1] not in roles:
        return _unknown(where)
    at = roles.index(parts[1])
    plan_sec = plan[at]
    sec = next((s for s in reversed(res.sections) if s.role == plan_sec.role), None)
    last_part = at == len(plan) - 1
    if sec is None:
        return _unknown(where)
    crash = CutAnswer("crashes", ASSERT_PAST_END + f" (llama_state_seq_load_file: {where}; the fields read past "
                                 "the end keep the values of the record before, which pass)")
    m_dsv4 = _DSV4_CUT.search(f.message)
    if plan_sec.kind == "dsv4_comp" and m_dsv4:
        # per layer: u32 il_ref (a loop-local, checked against the layer), then the kv and score records,
        # each read by a call of dsv4_state_read_tensor_streams (its fields are that call's own)
        if m_dsv4.group(1) != "score" or m_dsv4.group(2) != "payload":
            return _unknown(where)
        done = sum(1 for r in sec.records if r.role == "csc") + 1  # the cut one is not among the records
        if done < len(plan_sec.layers):  # the next layer's il_ref keeps this layer's id
            return CutAnswer("refuses", f"DSV4 compressor state layer id mismatch ({where}: the next layer's id "
                                        "keeps this layer's)")
        return crash if last_part else _unknown(where)
    m = _RECORD_CUT.search(f.message)
    if boundary is not None:
        role, part = str(boundary.extra["role"]), "header"
    elif m is None:
        return _unknown(where)
    else:
        role, part = m.group(1).lower(), m.group(2)
    if plan_sec.kind == "kv":
        if len(parts) < 3 or not parts[2].startswith("stream"):
            return _unknown(where)
        si = int(parts[2][6:])
        st = next((s for s in sec.streams if s.index == si), None)
        if st is None or st.v_trans is None:
            return _unknown(where)
        cut_type = _cut_record_type(res, f.path) if part == "payload" else None
        k_type = st.k_layers[0].type_id if st.k_layers else cut_type if role == "k" else None
        v_type = st.v_layers[0].type_id if st.v_layers else cut_type if role == "v" else None
        loops = _kv_loops(plan_sec, profile, k_type, v_type, bool(st.v_trans))
        done_recs = {"k": st.k_layers, "v": st.v_layers}
        li = {"k": 0, "v": 1}.get(role)
        later_stream = sec.n_stream is not None and si < sec.n_stream - 1
    elif plan_sec.kind == "recurrent":
        loops = _recurrent_loops(plan_sec, profile)
        done_recs = {"r": sec.r_layers, "p": sec.p_layers, "s": sec.s_layers}
        li = {"r": 0, "p": 0, "s": 1}.get(role)
        later_stream = False
    else:
        return _unknown(where)
    if li is None:
        return _unknown(where)
    loop = loops[li]
    parsed = [r for key, recs in done_recs.items() if ({"k": 0, "v": 1, "r": 0, "p": 0, "s": 1}[key] == li)
              for r in recs]
    # the records read whole must be the ones expected, else the model does not describe this file well
    # enough to replay the rest; the cut record is the next one (the reader lists only whole records)
    kinds = [r.kind for r in loop]
    n_done = len(parsed)
    if n_done >= len(loop) or kinds[n_done][0] != role:
        return _unknown(where)
    for rec, got in zip(loop, sorted(parsed, key=lambda r: r.header_offset), strict=False):
        want_row = rec.values[1] if rec.kind in ("k", "v", "r", "s") else rec.values[0] if rec.kind == "p" else None
        got_row = got.row_bytes if rec.kind != "vt" else None
        if (rec.kind != "p" and got.type_id != rec.values[0]) or (want_row is not None and got_row != want_row) or \
                (rec.kind == "vt" and (got.el_bytes, got.n_embd_v_gqa) != rec.values[1:]):
            return _unknown(where)
    j = n_done
    if part == "payload":
        field, present = len(_FIELDS[kinds[j]]), 0
    else:
        into = res.size - f.offset
        sizes = [size for _, size, _ in _FIELDS[kinds[j]]]
        field, present = 0, into
        while field < len(sizes) and present >= sizes[field]:
            present -= sizes[field]
            field += 1
    refused = _replay(loop, j, field, present, where)
    if refused is not None:
        return refused
    more = any(loops[li + 1:]) or later_stream or not last_part
    return _unknown(where) if more else crash


# errors libllama's file API never sees: bytes after the end of the state (it stops where the state
# ends), token ids (it copies them without looking: llama-server's validate() is what checks them)
_LIBLLAMA_BLIND = ("trailing_bytes", "token_out_of_vocab")


def _lib_blind(res: ParseResult) -> bool:
    """Every error in the file is one ``llama_state_seq_load_file`` does not check (it loads)."""
    errors = [f for f in res.findings if f.severity == "error"]
    return res.kind == "seq_file" and bool(errors) and all(f.code in _LIBLLAMA_BLIND for f in errors)


def server_after(srv: ConsumerAnswer, lib_answer: str, lib_message: str) -> ConsumerAnswer | None:
    """llama-server's answer once libllama's answer of the same build is known (measured by Verify): where the
    predicted server answer only followed libllama's predicted one, it follows the measured one; None where the
    server's own checks (its token list, the slot context, the vocabulary) decided it, or nothing follows."""
    if not srv.follows_lib:
        return None
    if lib_answer == "refuses":
        return ConsumerAnswer(srv.build, "llama-server", "refuses", SERVER_PREFIX + LOAD_FAILED)
    if lib_answer == "crashes":
        return ConsumerAnswer(srv.build, "llama-server", "crashes", lib_message)
    if lib_answer == "loads":
        answer, message = srv.if_lib_loads or (srv.answer, srv.message)
        return ConsumerAnswer(srv.build, "llama-server", answer, message)
    return None


def _server(res: ParseResult, profile: ModelProfile | None, lib: ConsumerAnswer, n_ctx: int | None) -> ConsumerAnswer:
    """llama-server's answer, with whether it is libllama's and what it would be were libllama to load it."""
    srv = _server_answer(res, profile, lib, n_ctx)
    if srv.follows_lib and lib.answer != "loads":
        loads = _server_answer(res, profile, ConsumerAnswer(lib.build, "libllama", "loads", ""), n_ctx)
        srv.if_lib_loads = (loads.answer, loads.message)
    return srv


def _server_answer(res: ParseResult, profile: ModelProfile | None, lib: ConsumerAnswer,
                   n_ctx: int | None) -> ConsumerAnswer:
    def ans(answer: str, message: str = "", follows: bool = False) -> ConsumerAnswer:
        return ConsumerAnswer(lib.build, "llama-server", answer, message, follows)

    if res.kind != "seq_file":
        return ans("refuses", f"llama-server restores slot files (sequence files), not a {res.kind}")
    n_tok = res.header.get("n_token_count")
    if lib.answer != "refuses" and res.size >= 12 and isinstance(n_tok, int) and 12 + 4 * n_tok > res.size:
        # the restore asks for the token count first (tokens_out NULL): "token count in sequence state file
        # exceeds the file size!", 0, before anything is read past the end
        return ans("refuses", SERVER_PREFIX + LOAD_FAILED)
    if lib.answer == "crashes":
        return ans("crashes", lib.message, True)
    if lib.answer == "refuses":
        return ans("refuses", SERVER_PREFIX + LOAD_FAILED, True)
    payload = res.token_payload or {}
    version = payload.get("version")
    if version is not None and int(version) != SERVER_TOKENS_VERSION:
        return ans("refuses", SERVER_PREFIX + "Unsupported server tokens state version")
    if payload.get("n_media"):
        return ans("unknown", f"the slot holds media chunks: restored only by a server with --mmproj ({NO_MMPROJ} "
                              "without one)")
    tokens = token_array(res.tokens)
    if n_ctx is not None and tokens.size > n_ctx:
        return ans("refuses", SERVER_PREFIX + DOES_NOT_FIT)
    if profile is not None and first_outside_vocab(tokens, profile.n_vocab) is not None:
        return ans("refuses", SERVER_PREFIX + INVALID_TOKENS)
    if lib.answer == "unknown":
        return ans("unknown", lib.message, True)
    if profile is None:
        return ans("unknown", "libllama loads it; whether every token is in the vocabulary needs the model")
    return ans("loads", follows=True)


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
    cut = cut_file_answer(res, profile)
    out: list[ConsumerAnswer] = []
    for b in BUILDS:
        c = by_build.get(b.name)
        header_refusal = c is not None and c.stage == "header" and c.loads is False
        if cut is not None and not header_refusal:
            lib = ConsumerAnswer(b.name, "libllama", cut.answer, cut.message)
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
        srv = _server(res, profile, lib, n_ctx)
        if c is not None and c.launch_env and cut is None:
            _launch_note(c, lib, srv)
        out += [lib, srv]
    return out


def _launch_note(c: GenCompat, lib: ConsumerAnswer, srv: ConsumerAnswer) -> None:
    """Say that the answer is a default launch's where another launch (``c.launch_env``) answers otherwise."""
    env = c.launch_env
    if lib.answer == "loads" and c.launch_answer != "loads":
        lib.message = f"on a default launch; launched with {env} it refuses: {c.launch_answer}"
        if srv.answer == "loads":
            srv.message = f"on a default launch; started with {env} it refuses: {SERVER_PREFIX}{LOAD_FAILED}"
    elif lib.answer in ("refuses", "unknown") and c.launch_answer == "loads" and srv.answer == lib.answer \
            and srv.message.startswith(SERVER_PREFIX):
        srv.message += f" (on a default launch; started with {env} it restores the slot)"
