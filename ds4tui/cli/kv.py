"""`ds4tui kv`: list, inspect, pin, delete and evict the `.kv` files of a cache directory.

Owns: the command line over `ds4tui.cache` (argument parsing, prefix
resolution, table/detail/JSON output). Everything shown that came from a file
(titles, names, text) goes through `format.display.safe_text`, so a file cannot drive
the terminal; sizes read as `format.display.human_bytes`.
JSON output is ASCII-escaped for the same reason.

The directory is `--dir`, else the config file's `cache_dir`, else
`paths.cache_dir()` ($DS4TUI_CACHE_DIR or platformdirs); the budget of
`evict` is `--budget-mb`, else the config's `budget_mb` (4096).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import time
from pathlib import Path

from ds4tui.cli.errors import CliError
from ds4tui.config import load_config  # a bad file: ConfigError, one line (cli/__init__.py)
from ds4tui.format.display import human_bytes, local_time, relative_time, safe_text, score_text

_HEX = re.compile(r"^[0-9a-fA-F]{1,40}$")


def register(subparsers) -> None:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--dir", metavar="DIR", help="cache directory (default: config cache_dir, $DS4TUI_CACHE_DIR or platformdirs)")
    kv = subparsers.add_parser(
        "kv", help="list and manage the disk KV cache (.kv files)",
        description="List and manage the .kv files of a KV cache directory, including files ds4 wrote.",
    )
    kv.set_defaults(func=cmd_ls, dir=None, json=False, verify=False)
    verbs = kv.add_subparsers(title="commands", metavar="VERB")

    p = verbs.add_parser("ls", parents=[common], help="one row per file (default)",
                         description="One row per .kv file: sha (* = pinned), reason, tokens, hits, size, last used, eviction score"
                                     " (per MiB: lowest goes first), model, title (an untitled file: the chat it belongs to,"
                                     " else its first message, as the cache browser names it), status.")
    p.add_argument("--json", action="store_true", help="print a JSON list (same keys as inspect --json)")
    p.add_argument("--verify", action="store_true", help="read every file whole to check its checksum")
    p.set_defaults(func=cmd_ls, verify=False)

    p = verbs.add_parser("inspect", parents=[common], help="every decoded field of one file",
                         description="Decode one file: header fields, ext flags, title, trailers, the DSV4 payload header, a text preview and its validity.")
    p.add_argument("file", metavar="FILE", help="a path, or a sha prefix in the cache directory")
    p.add_argument("--json", action="store_true", help="print a JSON object")
    p.set_defaults(func=cmd_inspect)

    for verb, helptext in (("pin", "never evict this file"), ("unpin", "let eviction consider it again"),
                           ("rm", "delete this file")):
        p = verbs.add_parser(verb, parents=[common], help=helptext, description=f"{verb}: {helptext}.")
        p.add_argument("sha", metavar="SHA_PREFIX", help="a unique prefix of the file's sha")
        p.set_defaults(func=cmd_edit, verb=verb)

    p = verbs.add_parser("grep", parents=[common], help="find chats: titles and transcripts decoded from stored text",
                         description="Search every .kv file's title and transcript (decoded from its stored text) "
                                     "for PATTERN, case-insensitively; one line per match, newest first.")
    p.add_argument("pattern", metavar="PATTERN", help="text to find (a regular expression with --regex)")
    p.add_argument("--regex", action="store_true", help="PATTERN is a regular expression")
    p.add_argument("--json", action="store_true",
                   help="print a JSON list of {sha, title, role, message, line, tokens, file_bytes, created_at, last_used}")
    p.set_defaults(func=cmd_grep)

    p = verbs.add_parser("export", parents=[common], help="a chat as Markdown or JSON (OpenAI messages)",
                         description="Export one file's transcript, parsed back from its stored text with the chat "
                                     "template: Markdown, or JSON {title, created_at, last_used, sha, messages}. "
                                     "ChatML, DeepSeek V4, Gemma and Llama 3 transcripts need no model; others name "
                                     "it with --model.")
    p.add_argument("query", metavar="SHA_OR_TITLE",
                   help="a sha prefix, or a titled session's title or its start (as --resume takes it)")
    p.add_argument("--format", choices=("md", "json"), default="md", help="md (default) or json")
    p.add_argument("--model", metavar="SPEC", help="parse with this model's chat template (loaded only if needed)")
    p.add_argument("-o", "--output", metavar="FILE", help="write to FILE instead of stdout")
    p.set_defaults(func=cmd_export)

    p = verbs.add_parser("evict", parents=[common], help="delete the lowest-scoring files until under budget",
                         description="Delete the lowest-scoring unpinned files until the directory fits the budget.")
    p.add_argument("--budget-mb", type=int, metavar="N", help="budget in MiB (default: config budget_mb, 4096)")
    p.add_argument("--dry-run", action="store_true", help="only show what would be deleted")
    p.set_defaults(func=cmd_evict)


# -- helpers ---------------------------------------------------------------------


def _cache_dir(args) -> Path:
    from ds4tui import paths

    if args.dir:
        return paths.cache_dir(args.dir)
    return load_config().cache_path()


def _store(args, budget_mb: int | None = None, *, write: bool = False):
    """The store of the chosen directory; CliError (one line) when that directory cannot be
    used: not a directory, unreadable, or read-only for a verb that writes."""
    from ds4tui.cache import KvStore

    store = KvStore(_cache_dir(args), budget_mb=budget_mb)
    problem = store.problem(write=write)
    if problem:
        raise CliError(problem)
    return store


def _resolve(store, prefix: str) -> str:
    """The one sha in the store starting with `prefix`, or a CliError naming the problem."""
    if not _HEX.match(prefix):
        raise CliError(f"{prefix!r} is not a sha prefix (1-40 hex digits)")
    found = store.find(prefix)
    if not found:
        raise CliError(f"no .kv file matches {prefix!r} in {store.dir}")
    if len(found) > 1:
        shown = ", ".join(s[:12] for s in found[:8]) + (", ..." if len(found) > 8 else "")
        raise CliError(f"ambiguous prefix {prefix!r} matches {len(found)} files: {shown}")
    return found[0]


# `kv ls` title column: at least this wide, wider when the terminal has room.
LS_TITLE_MIN, LS_TITLE_MAX = 14, 48


def ls_lines(entries, now: float, columns: int, names: dict[str, str]) -> list[str]:
    """The `kv ls` table: fixed columns first, then the title (as wide as the terminal allows)
    and the status. `names`: path -> the file's name (`chat.file_names`, the cache browser's
    rule: an untitled checkpoint is named after its chat or first message), terminal-safe. A `*` after the SHA marks a pinned file; exact times are in `kv inspect`.
    The model column appears only when the files come from more than one model (the footer
    names the one model otherwise)."""
    models = {e.model for e in entries}
    model_w = max(len("MODEL"), *(len(m) for m in models)) if len(models) > 1 else 0
    fixed = 11 + 1 + 13 + 1 + 6 + 1 + 4 + 1 + 9 + 1 + 8 + 1 + 6 + 1 + (model_w + 1 if model_w else 0)
    # The status is last: "ok" for a healthy file; a long verdict may run past the edge.
    title_w = max(LS_TITLE_MIN, min(LS_TITLE_MAX, columns - fixed - 1 - len("STATUS")))

    def row(sha, reason, tokens, hits, size, used, score, model, title, status) -> str:
        model_cell = f"{model:<{model_w}} " if model_w else ""
        return (f"{sha:<11} {reason:<13} {tokens:>6} {hits:>4} {size:>9} {used:<8} {score:>6} "
                f"{model_cell}{_fit(title, title_w):<{title_w}} {status}")

    out = [row("SHA", "REASON", "TOKENS", "HITS", "SIZE", "USED", "SCORE", "MODEL", "TITLE", "STATUS")]
    for e in entries:
        h = e.header
        out.append(row((e.sha or "?")[:10] + ("*" if e.pinned else ""), h.reason if h else "?",
                       h.tokens if h else 0, h.hits if h else 0, human_bytes(e.file_bytes),
                       relative_time(h.last_used if h else None, now, never="-"), score_text(e.score.score) if e.score else "-",
                       e.model, names.get(e.path) or "-", _status(e)))
    return out


def _fit(shown: str, width: int) -> str:
    """Cut already-escaped text to `width` columns, "…" last (escapes make text longer)."""
    return shown if len(shown) <= width else shown[:width - 1] + "…"


def _status(e) -> str:
    return "ok" if e.valid else safe_text(e.error, 80)


def _print_json(obj) -> None:
    print(json.dumps(obj, indent=2))


def _entries_by_path(store, verify_path: str) -> dict[str, object]:
    """Every entry of the store, scored; the one at `verify_path` with its checksum checked."""
    from ds4tui.cache import inspect_file

    out = {e.path: e for e in store.entries()}
    if verify_path in out:
        verified = inspect_file(verify_path, verify=True)
        verified.score, verified.superseded = out[verify_path].score, out[verify_path].superseded
        out[verify_path] = verified
    return out


# -- ls --------------------------------------------------------------------------


def cmd_ls(args) -> int:
    store = _store(args)
    entries = sorted(store.entries(verify=args.verify), key=lambda e: (e.header.last_used if e.header else 0),
                     reverse=True)
    if args.json:
        rows = []
        for e in entries:
            row = _json_of(e)
            row["text_preview"] = row["text_preview"][:80]
            rows.append(row)
        _print_json(rows)
        return 0
    if not entries:
        missing = "" if store.dir.exists() else " (no such directory yet: the chat creates it)"
        print(f"no .kv files in {store.dir}{missing}")
        return 0
    from ds4tui.chat.file_names import name_entries

    names = {path: name.text for path, name in name_entries(entries, store.indexed_texts, store.chats_of(entries)).items()}
    for line in ls_lines(entries, time.time(), shutil.get_terminal_size().columns, names):
        print(line)
    total = sum(e.file_bytes for e in entries)
    models = sorted({e.model for e in entries})
    one_model = f", model {models[0]}" if len(models) == 1 else ""
    print(f"{len(entries)} file(s), {human_bytes(total)}{one_model} in {store.dir}")
    temp = store.temp_bytes()
    if temp:
        print(f"plus {human_bytes(temp)} of saves in progress (temp files, counted toward the budget)")
    return 0


# -- inspect ---------------------------------------------------------------------


def _locate(args) -> tuple[Path, object | None]:
    """The file to inspect, and its scored entry when it lives in a cache directory."""
    if not args.file.strip():
        raise CliError("inspect needs a .kv file path or a sha prefix, got an empty name")
    given = Path(args.file).expanduser()
    if given.is_dir() and not given.is_symlink():
        raise CliError(f"{args.file}: is a directory, not a .kv file")
    if os.path.lexists(given):
        from ds4tui.cache import KvStore
        from ds4tui.format.kvc import sha_from_name

        if sha_from_name(given.name):  # score it among its neighbours
            return given, _entries_by_path(KvStore(given.parent), str(given)).get(str(given))
        return given, None
    if not _HEX.match(args.file):
        raise CliError(f"{args.file}: no such file")
    store = _store(args)
    path = store.path_for(_resolve(store, args.file))
    return path, _entries_by_path(store, str(path)).get(str(path))


def cmd_inspect(args) -> int:
    from ds4tui.cache import inspect_file

    path, entry = _locate(args)
    if entry is None:
        entry = inspect_file(path, verify=True)
    if entry.error == "file not found":
        raise CliError(f"{path}: no such file")
    if entry.header is None and not args.json:
        raise CliError(f"{path}: {entry.error}")
    if args.json:
        _print_json(_json_of(entry))
    else:
        _print_detail(entry)
    if entry.corrupt or entry.header is None:
        raise CliError(f"{path}: {entry.error}")
    return 0


def _print_detail(e) -> None:
    """Long because it is the table of a file's fields, one row each."""
    from ds4tui.format.kvc import model_name, payload_abi_name

    h = e.header
    rows = [
        ("file", safe_text(e.path)),
        ("sha", e.sha or "-"),
        ("status", "ok" if e.valid else safe_text(e.error)),
        ("magic", f"{e.magic}  version {h.version}"),
        ("reason", f"{h.reason} ({h.reason_code})"),
        ("ext_flags", f"0x{h.ext_flags:02x} {', '.join(h.ext_flag_names) or '-'}"),
        ("model_id", f"{h.model_id} ({model_name(h.model_id)})"),
        ("payload_abi", f"{h.payload_abi} ({payload_abi_name(h.payload_abi)})"),
        ("quant_bits", f"{h.quant_bits}" + (f" ({h.quant} bits, marked ds4tui: ds4 does not read it)"
                                            if h.quant != h.quant_bits else "")),
        ("tokens", str(h.tokens)),
        ("hits", str(h.hits)),
        ("ctx_size", str(h.ctx_size)),
        ("created_at", f"{local_time(h.created_at)} ({h.created_at})"),
        ("last_used", f"{local_time(h.last_used)} ({h.last_used})"),
        ("text_bytes", str(h.text_bytes)),
        ("payload_bytes", str(h.payload_bytes)),
        ("file_bytes", f"{e.file_bytes} ({human_bytes(e.file_bytes)})"),
        ("pinned", "yes" if e.pinned else "no"),
        ("checksum", _checksum_words(e)),
        ("title", safe_text(e.title) if e.title is not None else "-"),
    ]
    t = e.trailers
    if t:
        parts = []
        if t.get("tool_map"):
            tm = t["tool_map"]
            ids = ", ".join(safe_text(i, 24) for i in tm["ids"][:5]) + (", ..." if tm["count"] > 5 else "")
            parts.append(f"tool map {tm['count']} entries ({ids}), {tm['dsml_bytes']} B of DSML")
        if t.get("title_bytes") is not None:
            parts.append(f"title {t['title_bytes']} B")
        if t.get("extra_bytes"):
            parts.append(f"{t['extra_bytes']} unknown trailing bytes")
        rows.append(("trailers", "; ".join(parts) or "none"))
    if e.score:
        s = e.score
        rows.append(("score", f"{score_text(s.score)} per MiB (effective hits {s.effective_hits:.2f}, anchor x{s.anchor_weight:g}, "
                              f"superseded x{s.superseded_factor:.3g}){'  pinned: never evicted' if e.pinned else ''}"))
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    if e.payload:
        print("payload (DSV4 header):")
        for k, v in e.payload.items():
            shown = f"0x{v:08x}" if k == "magic" else str(v)
            print(f"  {k:<20} {shown}")
        from ds4tui.format.swa_policy import describe_payload, payload_kv_dtype, payload_row_order

        print(f"  {'swa_policy':<20} {describe_payload(e.payload, h.model_id)}")
        print(f"  {'kv_dtype':<20} {payload_kv_dtype(e.payload, h.model_id)}")
        print(f"  {'kv_rows':<20} {payload_row_order(e.payload, h.model_id)}")
    elif e.deep and h.payload_bytes:
        print("payload: opaque (does not start with DSV4)")
    if e.text_preview:
        print("text preview:")
        print("  " + safe_text(e.text_preview, 300))


def _checksum_words(e) -> str:
    return {"ok": "ok (xxh3)", "mismatch": "mismatch", "none": "none (ds4 file, or written before checksums)",
            "unchecked": "present, not checked"}.get(e.checksum, "-")


def _json_of(entry) -> dict:
    """entry.to_json(), the payload object extended by `swa_policy`: the SWA storage policy
    its DSV4 header announces ("full", "periodic:K", "zero" or "unknown"), `kv_dtype`
    ("f16" or "f32", the K/V row type) and `kv_rows` ("head-major" or "token-major", their order)."""
    from ds4tui.format.payload import MODEL_ID_LLAMA
    from ds4tui.format.swa_policy import kv_dtype_of_version, payload_kv_dtype, payload_row_order, policy_of_version

    obj = entry.to_json()
    payload = obj["payload"]
    if payload:
        model_id = obj.get("model_id")
        try:
            version = int(payload["payload_version"])
            if model_id == MODEL_ID_LLAMA:
                version = kv_dtype_of_version(version)[1]
            policy = str(policy_of_version(version))
        except (KeyError, ValueError):
            policy = "unknown"
        obj["payload"] = dict(payload, swa_policy=policy, kv_dtype=payload_kv_dtype(payload, model_id),
                              kv_rows=payload_row_order(payload, model_id))  # a copy: the entry keeps the 13 fields
    return obj


# -- pin / unpin / rm / evict ------------------------------------------------------


def cmd_edit(args) -> int:
    store = _store(args, write=True)
    sha = _resolve(store, args.sha)
    if args.verb == "rm":
        try:
            gone = store.delete(sha)
        except OSError as exc:
            raise CliError(f"{sha[:12]}: cannot remove: {exc.strerror or exc}") from None
        if not gone:
            raise CliError(f"{sha[:12]}: already gone")
        print(f"removed {sha}")
        return 0
    if not store.set_pinned(sha, args.verb == "pin"):
        raise CliError(f"{sha[:12]}: cannot {args.verb}: not a writable regular KVC file")
    print(f"{'pinned' if args.verb == 'pin' else 'unpinned'} {sha}")
    if args.verb == "pin" and ds4_reads(store.path_for(sha)):
        print("note: a ds4 file: the pin holds against ds4tui only; ds4 ignores it and may still"
              " evict or consume the file (docs/format.md, \"Sharing a directory with ds4\")")
    return 0


def ds4_reads(path) -> bool:
    """Whether ds4's store would list this file (quant_bits 2 or 4, no ds4tui mark): its own."""
    from ds4tui.cache import inspect_file

    e = inspect_file(path, acceptor=None, deep=False)
    return e.header is not None and e.header.quant_bits in (2, 4)


def cmd_grep(args) -> int:
    from ds4tui.chat.search import search

    try:
        hits = search(_cache_dir(args), args.pattern, regex=args.regex)
    except re.error as exc:
        raise CliError(f"bad regular expression {args.pattern!r}: {exc}") from None
    if args.json:
        _print_json([{"sha": h.sha, "title": h.title, "role": h.role, "message": h.message, "line": h.line,
                      "tokens": h.tokens, "file_bytes": h.file_bytes, "created_at": h.created_at,
                      "last_used": h.last_used} for h in hits])
        return 0
    for h in hits:
        title = safe_text(h.title, 40) if h.title else "(untitled)"
        print(f"{h.sha[:12]}  {title}  {h.role}: {safe_text(h.line)}")
    return 0 if hits else 1


def _find_export(store, query: str) -> str:
    """The one file `query` names, by the rule `--resume` uses (chat/matching.py): a sha prefix
    (of any file), else a titled session's exact title, the title in any case, or its start."""
    from ds4tui.cache.entry import inspect_file
    from ds4tui.chat.matching import match_sessions

    files = []
    for sha in store.shas():
        e = inspect_file(store.path_for(sha), deep=True, preview_bytes=0)
        titled = e.valid and e.header is not None and e.header.titled and e.title is not None
        files.append((sha, e.title if titled else ""))
    found = match_sessions(query, files, lambda f: f[0], lambda f: f[1])
    if not found:
        raise CliError(f"no .kv file or titled session matches {query!r} in {store.dir}")
    if len(found) > 1:
        shown = ", ".join(f"{sha[:12]} {safe_text(title, 40)}".rstrip() for sha, title in found[:8])
        raise CliError(f"ambiguous: {len(found)} files match: {shown}{', ...' if len(found) > 8 else ''}")
    return found[0][0]


def cmd_export(args) -> int:
    from ds4tui.cache.entry import inspect_file
    from ds4tui.cache.files import read_text
    from ds4tui.chat import transcript

    store = _store(args)
    sha = _find_export(store, args.query)
    e = inspect_file(store.path_for(sha), deep=True, preview_bytes=0)
    if not e.valid or e.header is None:
        raise CliError(f"{sha[:12]}: {e.error}")
    raw = read_text(store.path_for(sha), e.header.text_bytes)
    if raw is None:
        raise CliError(f"{sha[:12]}: its text could not be read")
    text = raw.decode("utf-8", errors="replace")
    try:
        messages = transcript.parse_text(text)
    except ValueError as exc:
        if not args.model:
            raise CliError(f"{sha[:12]}: {exc}; name the model that wrote it with --model") from None
        from ds4tui.engine import EngineError, load_model

        try:
            template = load_model(args.model).chat
        except EngineError as exc:
            raise CliError(str(exc)) from None
        try:
            messages = transcript.parse_text(text, template)
        except ValueError as exc:
            raise CliError(f"{sha[:12]}: {exc}") from None
    h = e.header
    title = e.title if h.titled else None
    if args.format == "json":
        out = json.dumps(transcript.to_json(messages, title, h.created_at, h.last_used, sha), indent=2) + "\n"
    else:
        out = transcript.to_markdown(messages, title, h.created_at, h.last_used)
    write_or_print(out, args.output, as_json=args.format == "json")
    return 0


def write_or_print(out: str, output: str | None, *, as_json: bool) -> None:
    """An export to `output` as it is, or to stdout terminal-safe (JSON is ASCII-escaped
    already; Markdown keeps its newlines, every other control character escaped)."""
    if output:
        try:
            with open(output, "w", encoding="utf-8") as fp:
                fp.write(out)
        except OSError as exc:  # a missing folder, no permission, a full disk: one line, not a traceback
            raise CliError(f"cannot write {output}: {exc.strerror or exc}") from None
    elif as_json:
        print(out, end="")  # json.dumps escapes every non-ASCII and control character
    else:
        from ds4tui.format.display import safe_lines

        print(safe_lines(out), end="")


def cmd_evict(args) -> int:
    budget = args.budget_mb if args.budget_mb is not None else load_config().budget_mb
    if budget < 0:
        raise CliError("--budget-mb must be >= 0")
    store = _store(args, budget_mb=budget, write=not args.dry_run)
    total = sum(key[1] for key in store.stat_keys().values())  # one scandir: the pass scans for itself
    ev = store.evict(dry_run=args.dry_run)
    verb = "would evict" if args.dry_run else "evicted"
    for f in ev.files:
        print(f"{verb} {f.sha[:12]}  {f.reason:<13} tokens={f.tokens} hits={f.hits} size={human_bytes(f.bytes)} score={score_text(f.score)}")
    left = total - ev.bytes
    if not ev.files:
        print(f"nothing to evict: {human_bytes(total)} within the {human_bytes(ev.budget_bytes)} budget")
    else:
        print(f"{verb} {len(ev.files)} file(s), {human_bytes(ev.bytes)}; {human_bytes(left)} left of the"
              f" {human_bytes(ev.budget_bytes)} budget")
    if left > ev.budget_bytes:
        print("the rest is pinned; unpin files to go further under budget")
    return 0
