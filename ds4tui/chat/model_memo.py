"""Which model wrote the sessions of a cache directory: payload fingerprint -> model spec.

A .kv file names its model only by a fingerprint (a hash of config and weights), and
SmolLM2 and Gemma 3 files share a model id, so nothing in a file says "gemma3-270m".
Each chat that opens a cache directory notes its model here; `ds4tui --resume` (and Enter
in `ds4tui browse`) then opens a session with the model that wrote it, and a session of
another model names that model. A small JSON file beside the .kv files: the store, `kv`
and ds4 consider only `<sha1>.kv` names, so all of them ignore it. Best effort: a file
that cannot be read or written changes nothing but these conveniences.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ds4tui.cache.safe_open import open_regular
from ds4tui.format.kvc import PREFIX_BYTES, decode_header
from ds4tui.format.payload import read_fingerprint

MEMO_NAME = ".ds4tui-models.json"
MAX_MEMO_BYTES = 64 * 1024  # a few hundred models; a bigger file is not ours to trust


def _read(cache_dir: Path) -> dict[str, str]:
    try:
        with open_regular(Path(cache_dir) / MEMO_NAME) as fp:
            raw = fp.read(MAX_MEMO_BYTES + 1)
        if len(raw) > MAX_MEMO_BYTES:
            return {}
        data = json.loads(raw or b"{}")
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {k: v for k, v in data.items() if isinstance(k, str) and isinstance(v, str)}


def model_spec(spec: str) -> str:
    """The spec as another process can load it: a registered name as it is, a path absolute."""
    path = Path(spec).expanduser()
    return str(path.resolve()) if path.exists() else spec


def remember(cache_dir: Path, fingerprint_hex: str, spec: str) -> None:
    """Note that `spec` writes sessions with this fingerprint in `cache_dir`."""
    memo = _read(cache_dir)
    spec = model_spec(spec)
    if memo.get(fingerprint_hex) == spec:
        return
    memo[fingerprint_hex] = spec
    target = Path(cache_dir) / MEMO_NAME
    tmp = target.with_name(f"{MEMO_NAME}.{os.getpid()}.part")  # not a `*.kv.tmp.*` save name
    try:
        target.parent.mkdir(parents=True, exist_ok=True)  # the first save would create it anyway
        tmp.write_text(json.dumps(memo, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        os.replace(tmp, target)
    except OSError:
        tmp.unlink(missing_ok=True)


def spec_for(cache_dir: Path, fingerprint_hex: str | None) -> str | None:
    """The model noted for this fingerprint in `cache_dir`, or None."""
    if not fingerprint_hex:
        return None
    return _read(cache_dir).get(fingerprint_hex)


def file_fingerprint(path: Path) -> str | None:
    """The payload fingerprint of a ds4tui .kv file (hex), or None (not ours, unreadable)."""
    try:
        with open_regular(path) as fp:
            header = decode_header(fp.read(PREFIX_BYTES))
            found = read_fingerprint(fp, PREFIX_BYTES + header.text_bytes, header.payload_bytes)
    except (OSError, ValueError):
        return None
    return found.hex() if found else None


def writer_of(cache_dir: Path, sha: str) -> str | None:
    """The model spec that wrote `<sha>.kv` in `cache_dir`, when one was noted."""
    return spec_for(cache_dir, file_fingerprint(Path(cache_dir) / f"{sha}.kv"))
