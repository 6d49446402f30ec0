"""A cache directory of many files, as a long-lived chat user's looks: for `bench cache --files`.

Owns generating it: chats that share a few system prompts, each with its titled session (the
whole conversation) and the untitled checkpoints written on the way (the shared system
prompt's `cold` file, `continued` ones as the chat grew, an `evict` one), every file a whole
KVC file with the checksum trailer and a ds4tui payload (DSV4 framing and a model
fingerprint, then zeros), written straight to disk (the store's save would rescan the
directory for each one). Texts are ChatML, as SmolLM2's template renders them. Seeded:
the same arguments give the same files.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

from ds4tui.format.kvc import (
    EXT_CHECKSUM,
    EXT_SESSION_TITLE,
    QUANT_DS4TUI_MARK,
    KvcHeader,
    build_kvc,
    kv_name,
    reason_code,
    text_sha,
    title_sha,
)
from ds4tui.format.payload import (
    DS4TUI_PAYLOAD_ABI,
    DSV4_MAGIC,
    FINGERPRINT_BYTES,
    MODEL_ID_LLAMA,
    Dsv4Header,
    pack_dsv4_header,
)

WORDS = ("cache prefix token model layer budget pin evict restore chat system prompt answer "
         "question reason file header index disk memory session write read shared kernel "
         "attention window context batch stream title score").split()
SYSTEM_PROMPTS = 4
CTX = 8192
FINGERPRINT = bytes(range(FINGERPRINT_BYTES))


def _sentence(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n)).capitalize() + "."


def _turn(role: str, content: str) -> str:
    return f"<|im_start|>{role}\n{content}<|im_end|>\n"


def _payload(tokens: int, payload_bytes: int) -> bytes:
    head = pack_dsv4_header(Dsv4Header(DSV4_MAGIC, 1, CTX, 2048, 0, 0, 0, tokens, 30, 64, 0, 49152, 0))
    body = head + FINGERPRINT
    return body + bytes(max(0, payload_bytes - len(body)))


def _write(directory: Path, name: str, data: bytes, mtime: int) -> None:
    path = directory / name
    with open(path, "wb") as fp:
        fp.write(data)
    os.utime(path, (mtime, mtime))


def _file(text: bytes, tokens: int, reason: str, payload_bytes: int, at: int, hits: int,
          title: bytes | None = None) -> bytes:
    flags = EXT_CHECKSUM | (EXT_SESSION_TITLE if title is not None else 0)
    header = KvcHeader(quant_bits=8 | QUANT_DS4TUI_MARK, reason_code=reason_code(reason), ext_flags=flags,
                       model_id=MODEL_ID_LLAMA, tokens=tokens, hits=hits, ctx_size=CTX,
                       payload_abi=DS4TUI_PAYLOAD_ABI, created_at=at, last_used=at, payload_bytes=0,
                       text_bytes=0)
    return build_kvc(header, text, _payload(tokens, payload_bytes), title=title, checksum=True)


def make_cache_dir(directory: str | os.PathLike, files: int, *, payload_bytes: int = 16 << 10,
                   seed: int = 0, now: int = 1_760_000_000) -> int:
    """Write about `files` files into `directory` (created); returns how many were written."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    systems = [_turn("system", " ".join(_sentence(rng, 40) for _ in range(8))) for _ in range(SYSTEM_PROMPTS)]
    written = 0
    for s in systems:
        text = s.encode()
        _write(directory, kv_name(text_sha(text)), _file(text, len(text) // 4, "cold", payload_bytes, now - 86400, 5),
               now - 86400)
        written += 1
    chat = 0
    while written < files:
        at = now - rng.randrange(0, 30 * 86400)
        text = systems[chat % SYSTEM_PROMPTS]
        stops = []
        for turn in range(8):
            text += _turn("user", _sentence(rng, rng.randrange(8, 40)))
            text += _turn("assistant", " ".join(_sentence(rng, 20) for _ in range(rng.randrange(2, 8))))
            stops.append(text)
        for i, reason in ((2, "continued"), (4, "continued"), (6, "continued"), (7, "evict")):
            if written >= files - 1:
                break
            t = stops[i].encode()
            _write(directory, kv_name(text_sha(t)),
                   _file(t, len(t) // 4, reason, payload_bytes, at + 60 * i, rng.randrange(0, 3)), at + 60 * i)
            written += 1
        title = f"Chat {chat}: {_sentence(rng, 4)}".encode()
        full = stops[-1].encode()
        created = at
        _write(directory, kv_name(title_sha(title, created)),
               _file(full, len(full) // 4, "shutdown", payload_bytes, created, rng.randrange(0, 10), title=title),
               created + 600)
        written += 1
        chat += 1
    return written



# -- `ds4tui bench cache --files N`: the listing operations at scale ------------------------

GOAL_S = 1.0

# Each operation runs in a fresh interpreter (as a command, or a chat's first message, meets
# the directory) and times itself from the store's construction; `cpu_s` is that process's
# CPU time over the same span, which a busy machine does not inflate as it does wall time.
_OPERATION = r"""
import json, sys, time
t0, c0 = time.perf_counter(), time.process_time()
from ds4tui.cache import Acceptor, KvStore
from ds4tui.cache.eviction import EvictionPlan
op, directory, prompt_path = sys.argv[1:4]
acceptor = Acceptor(model_id=0x80, ctx_size=8192, quant_bits=8)
store = KvStore(directory)
t0, c0 = time.perf_counter(), time.process_time()
extra = {}
if op == "kv_ls":
    import shutil
    from ds4tui.chat.file_names import name_entries
    from ds4tui.cli.kv import ls_lines
    entries = store.entries()
    names = {p: n.text for p, n in name_entries(entries, store.indexed_texts, store.chats_of(entries)).items()}
    lines = ls_lines(entries, time.time(), 160, names)
    extra["rows"] = len(lines) - 1
elif op == "lookup":
    prompt = open(prompt_path, "rb").read()
    found = store.lookup(prompt, acceptor)
    extra["hit_tokens"] = found[0].header.tokens if found else 0
elif op == "evict_plan":
    total = sum(key[1] for key in store.stat_keys().values())
    ev = store.evict(budget_bytes=total // 2, dry_run=True)
    extra["would_evict"] = len(ev.files)
elif op == "browser":
    from ds4tui.cache import scan as cache_scan
    from ds4tui.chat.file_names import name_files
    texts = cache_scan.TextIndex()
    result = cache_scan.scan(store, acceptor, gen=1, now=time.time(), texts=texts,
                             checksums=cache_scan.ChecksumIndex(), read_checksums=False)
    names = name_files(result, texts)
    plan = EvictionPlan.build(result.entries, store.budget_bytes, store.overhead_bytes())
    extra["rows"] = len(result.entries)
    extra["unchecked"] = result.unchecked
print(json.dumps({"wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0, **extra}))
"""

OPERATIONS = (
    ("kv_ls", "kv ls, no index yet (builds it)"),
    ("kv_ls", "kv ls"),
    ("lookup", "lookup (a chat's first message)"),
    ("evict_plan", "eviction planning (kv evict --dry-run)"),
    ("browser", "cache browser's first screen"),
)


def _operation(op: str, directory: Path, prompt: Path) -> dict:
    import json
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _OPERATION, op, str(directory), str(prompt)],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _command_s(directory: Path) -> float:
    """The whole `ds4tui kv ls` command, interpreter start and printing included."""
    import subprocess
    import sys
    import time

    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "ds4tui", "kv", "ls", "--dir", str(directory)],
                   stdout=subprocess.DEVNULL, check=True)
    return time.perf_counter() - t0


def run_scale(files: int, payload_bytes: int, work: Path) -> dict:
    import time

    directory = work / "kv"
    t0 = time.perf_counter()
    written = make_cache_dir(directory, files, payload_bytes=payload_bytes)
    made_s = time.perf_counter() - t0
    # A prompt extending one titled chat: the lookup must find that file among all others.
    from ds4tui.format.kvc import read_kvc

    for path in sorted(directory.glob("*.kv")):
        with open(path, "rb") as fp:
            kf = read_kvc(fp)
        if kf.header.titled:
            break
    prompt = kf.text + _turn("user", "And then?").encode()
    prompt_path = work / "prompt.txt"
    prompt_path.write_bytes(prompt)
    rows = []
    for op, label in OPERATIONS:
        r = _operation(op, directory, prompt_path)
        rows.append({"op": op, "label": label, **r})
    command = _command_s(directory)
    return {"files": written, "payload_bytes": payload_bytes, "generate_s": made_s,
            "total_bytes": sum(p.stat().st_size for p in directory.iterdir()),
            "operations": rows, "kv_ls_command_s": command, "goal_s": GOAL_S, "cpus": os.cpu_count()}


def scale_table(r: dict) -> str:
    from ds4tui.format.display import human_bytes

    lines = [f"{r['files']} files ({human_bytes(r['total_bytes'])}, generated in {r['generate_s']:.1f} s),"
             f" {r['cpus']} CPUs; goal <= {r['goal_s']:.0f} s each (the first kv ls builds the index)",
             f"{'operation':<42} {'wall s':>7} {'cpu s':>7}  goal"]
    for row in r["operations"]:
        first = row["label"].startswith("kv ls, no index")
        verdict = "-" if first else ("ok" if row["wall_s"] <= r["goal_s"] else "MISSED")
        lines.append(f"{row['label']:<42} {row['wall_s']:>7.2f} {row['cpu_s']:>7.2f}  {verdict}")
    lines.append(f"{'ds4tui kv ls, the whole command':<42} {r['kv_ls_command_s']:>7.2f} {'':>7}  "
                 "(interpreter start and printing included)")
    return "\n".join(lines)
