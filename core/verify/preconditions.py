"""What Repair, Verify and "Show the damage" need before they start, one function per action.

Each says, from the parse alone and before any engine starts, why its action cannot run (one line), or
None when it can: :func:`repair_problem` (``kvscope repair``, the app's Repair…), :func:`verify_problem`
(``kvscope verify``, the app's Verify), :func:`show_damage_problem` (the app's "Show the damage", which
selects the bytes :func:`damage_finding` names). The command line and the app ask the same functions, so
an action the app offers is one the command would run, and a refusal reads the same in both.

The conditions: no model; an empty file, or one that is not a llama.cpp state file; a model the file does
not fit (``kvscope inspect``'s model mismatch); no tokens (a blob given none); a token outside the model's
vocabulary (llama-server refuses such a prompt with HTTP 400, libllama's decode fails); media chunks; no
pinned build that writes the file's layout. Verify still runs on a file whose own tokens are outside the
vocabulary: what the engine does with them is its verdict (llama-server's "Invalid tokens in slot save file").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from kvscope.core.analysis.slot_tokens import first_outside_vocab, holds_media, token_array
from kvscope.core.analysis.verdict import model_mismatch_reason

if TYPE_CHECKING:
    from kvscope.core.analysis.verdict import Verdict
    from kvscope.core.findings import Finding
    from kvscope.core.model.profile import ModelProfile
    from kvscope.core.reader.records import ParseResult

Tokens = Sequence[int] | Mapping[int, Sequence[int]]

REPAIR_NEEDS_MODEL = "Repair needs the GGUF model the file was written with"
VERIFY_NEEDS_MODEL = "Verify needs the GGUF model the file was written with"
GIVE_TOKENS = "--tokens"  # how the command line gives a blob's tokens (the app names its own action)


def _ids(tokens: Tokens) -> list[int]:
    return [int(t) for s in sorted(tokens) for t in tokens[s]] if isinstance(tokens, Mapping) \
        else [int(t) for t in tokens]


def _is_empty(res: ParseResult) -> bool:
    return res.kind == "unknown" and res.size == 0


def not_state_problem(res: ParseResult, what: str) -> str | None:
    """An empty file, or one that is not a llama.cpp state file (``what``: what there is then nothing to do)."""
    if res.kind != "unknown":
        return None
    if _is_empty(res):
        return f"the file is empty: {what}"
    return f"not a llama.cpp state file: {what}"


def vocab_problem(ids: Sequence[int], profile: ModelProfile | None, whose: str = "") -> str | None:
    """The first id of ``ids`` that is negative or outside the model's vocabulary, said in one line
    (``whose``: ``"the file's "``, ``"given "``); without a model only negative ids count."""
    if not ids:
        return None
    arr = token_array(ids)
    n_vocab = profile.n_vocab if profile is not None else 0
    real = arr[arr != -1] if whose == "the file's " and holds_media(arr) else arr  # media positions are -1
    bad = first_outside_vocab(real, n_vocab if n_vocab > 0 else 1 << 62)
    if bad is None:
        return None
    at = int(next(i for i, t in enumerate(ids) if int(t) == bad))
    if bad < 0:
        return f"{whose}token id {bad} is negative (position {at})"
    return (f"{whose}token id {bad} is outside the model's vocabulary of {n_vocab:,} (ids 0 to {n_vocab - 1:,}; "
            f"position {at}): llama.cpp cannot prefill it")


def given_tokens_problem(res: ParseResult, profile: ModelProfile | None, tokens: Tokens) -> str | None:
    """Why ``tokens`` (given for ``res``, as ``--tokens`` gives them) cannot be re-prefilled, or None."""
    from kvscope.core.reader.seq_owner import restore_seq
    from kvscope.core.verify.prefill import plan_prefill

    ids = _ids(tokens)
    if not ids:
        return "no token ids given: the list is empty"
    why = vocab_problem(ids, profile)
    if why is not None:
        return why
    plan = plan_prefill(res, restore_seq(res), tokens)
    if not plan.possible:
        return plan.reason or "nothing to re-prefill"
    return None


def model_problem(res: ParseResult, profile: ModelProfile, model: str = "the model", path: str = "the file") \
        -> str | None:
    """The model does not fit the file, as ``kvscope inspect`` judges it (its verdict's model mismatch)."""
    why = model_mismatch_reason(res, profile)
    if why is None:
        return None
    return (f"the model {model} does not fit {path} (kvscope inspect: model mismatch): {why}; give the model "
            "the file was written with")


def _state_and_model_problem(res: ParseResult, profile: ModelProfile, nothing: str, model: str,
                             path: str) -> str | None:
    """What repair and verify both ask first: a state file (``nothing``: what is then missing), and one the
    model fits."""
    return not_state_problem(res, nothing) or model_problem(res, profile, model, path)


def repair_problem(res: ParseResult, profile: ModelProfile | None, tokens: Tokens | None = None, *,
                   give_tokens: str = GIVE_TOKENS, model: str = "the model", path: str = "the file") -> str | None:
    """Why ``res`` cannot be rebuilt from its tokens (``kvscope repair``), one line, or None when it can
    (``tokens``: those given for a blob; ``give_tokens``: how the caller gives them)."""
    from kvscope.core.pinned_builds import build_writing
    from kvscope.core.reader.seq_owner import restore_seq
    from kvscope.core.reader.state_kinds import BLOB_KINDS
    from kvscope.core.verify.prefill import plan_prefill

    if profile is None:
        return REPAIR_NEEDS_MODEL
    why = _state_and_model_problem(res, profile, "there is nothing to rebuild", model, path)
    if why is not None:
        return why
    if tokens is None and res.kind in BLOB_KINDS and not res.tokens:
        return f"a state blob carries no tokens: give the ones it was made of with {give_tokens}"
    if tokens is not None:
        why = given_tokens_problem(res, profile, tokens)
        if why is not None:
            return f"the tokens given cannot be re-prefilled: {why}"
    else:
        why = vocab_problem(res.tokens, profile, "the file's ")
        if why is not None:
            return f"it cannot be rebuilt from its tokens: {why}"
        plan = plan_prefill(res, restore_seq(res))
        if plan.limit_pos is not None:
            return (f"the prompt holds {plan.n_media} media chunk(s) from position {plan.limit_pos}: they cannot be "
                    "re-prefilled from the file")
        if not plan.possible:
            return f"it cannot be re-prefilled: {plan.reason or 'no tokens'}"
    if build_writing(res.layout.name) is None:
        return (f"no pinned llama.cpp build writes layout {res.layout.name}: the rebuilt state would be of another "
                "layout generation")
    return None


def verify_problem(res: ParseResult, profile: ModelProfile | None, tokens: Tokens | None = None,
                   next_token: int | None = None, *, model: str = "the model", path: str = "the file") -> str | None:
    """Why ``res`` cannot be verified (``kvscope verify``), one line, or None when it can (``tokens``: those
    given; ``next_token``: ``--next-token``). A blob without tokens is verified by its restore alone, and a
    file whose own tokens the engine refuses is a verdict, not a refusal."""
    if profile is None:
        return VERIFY_NEEDS_MODEL
    why = _state_and_model_problem(res, profile, "there is nothing to restore", model, path)
    if why is not None:
        return why
    if next_token is not None and profile.n_vocab and not 0 <= next_token < profile.n_vocab:
        return (f"--next-token {next_token}: outside the model's vocabulary of {profile.n_vocab:,} tokens "
                f"(0 to {profile.n_vocab - 1:,})")
    if tokens is not None:
        why = given_tokens_problem(res, profile, tokens)
        if why is not None:
            return f"the tokens given cannot be re-prefilled: {why}"
    return None


def damage_finding(verdict: Verdict | None) -> Finding | None:
    """The finding "Show the damage" selects: where the missing bytes start, else the first error shown."""
    if verdict is None:
        return None
    if verdict.missing is not None:
        return verdict.missing.finding
    return next((f for f in verdict.top_findings if f.severity == "error"), None)


def show_damage_problem(res: ParseResult, verdict: Verdict | None) -> str | None:
    """Why there are no damaged bytes to show (one line), or None when :func:`damage_finding` names some."""
    if _is_empty(res):
        return "the file is empty: there are no bytes to show"
    if res.kind == "unknown":
        return "not a llama.cpp state file: no part of it is damaged rather than the rest"
    f = damage_finding(verdict)
    if f is None:
        return "no error finding: nothing is damaged"
    if f.length <= 0 and f.offset >= res.size:
        return "the damage lies past the end of the file: there are no bytes to show"
    return None
