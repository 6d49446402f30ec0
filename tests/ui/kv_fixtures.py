"""A fixture cache directory for the browser tests, built byte by byte with struct.pack.

Built from the published layout (docs/format.md, "KVC file format" and "The session
payload"), not with ds4tui's encoder, so
a shared mistake cannot hide. Every timestamp is fixed and `NOW` is the frozen
clock the tests give the browser, so relative times never age.
"""

from __future__ import annotations

import hashlib
import struct
from pathlib import Path

NOW = 1_764_410_400  # 2025-11-29 10:00:00 UTC
HOUR = 3600
DSV4_MAGIC = 0x34565344
LLAMA, FLASH = 0x80, 0  # model ids
ABI_DS4TUI, ABI_DS4 = 128, 2
FINGERPRINT = bytes(range(32))  # what the fake "current model" reports

TITLE = "Trip to Lisbon [bold]not markup[/bold]"
SESSION_TEXT = (
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "<|im_start|>user\nPlan three days in Lisbon. \x1b[31mred?\x1b[0m<|im_end|>\n"
    "<|im_start|>assistant\nDay 1: Alfama and the castle. Day 2: Belém.<|im_end|>\n"
)
COLD_TEXT = "<|im_start|>system\nYou are a careful code reviewer. Answer briefly.<|im_end|>\n"
DS4_TEXT = "<｜begin▁of▁sentence｜>You are DeepSeek. Summarize the repository layout."
CORRUPT_TEXT = "<|im_start|>user\nthis checkpoint was cut short<|im_end|>\n"


def header(*, tokens, text_bytes, payload_bytes, reason, ext=0, model=LLAMA, abi=ABI_DS4TUI,
           quant=4, hits=0, ctx=8192, created=NOW - 3 * HOUR, last_used=NOW - HOUR) -> bytes:
    out = b"KVC" + bytes([1, quant, reason, ext, model])           # 0 magic, 3 version .. 7 model_id
    out += struct.pack("<III", tokens, hits, ctx)                   # 8 tokens, 12 hits, 16 ctx_size
    out += bytes([abi, 0, 0, 0])                                    # 20 payload ABI, 21 reserved
    out += struct.pack("<QQQ", created, last_used, payload_bytes)   # 24, 32, 40
    return out + struct.pack("<I", text_bytes)                      # 48 text_bytes


def dsv4_payload(tokens: int, *, fingerprint: bytes | None, body: int = 200) -> bytes:
    fields = [DSV4_MAGIC, 1, 8192, 2048, 8192, 8192, 0, tokens, 30, 192, 0, 49152, tokens]
    out = struct.pack("<13I", *fields)
    if fingerprint is not None:
        out += fingerprint
    return out + bytes(body)


def title_trailer(title: bytes) -> bytes:
    return struct.pack("<I", len(title)) + title


def titled_sha(title: bytes, created: int) -> str:
    return hashlib.sha1(title + struct.pack("<Q", created)).hexdigest()


def write(directory: Path, sha: str, data: bytes) -> str:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{sha}.kv").write_bytes(data)
    return sha


def titled_session(directory: Path, *, title: str = TITLE, created: int = NOW - 26 * HOUR,
                   pinned: bool = False, text: str = SESSION_TEXT) -> str:
    t, tb = text.encode(), title.encode()
    payload = dsv4_payload(64, fingerprint=FINGERPRINT)
    ext = 0x08 | (0x80 if pinned else 0)
    data = header(tokens=64, text_bytes=len(t), payload_bytes=len(payload), reason=6, ext=ext,
                  hits=3, created=created, last_used=NOW - 2 * HOUR) + t + payload + title_trailer(tb)
    return write(directory, titled_sha(tb, created), data)


def cold_checkpoint(directory: Path, text: str = COLD_TEXT, *, fingerprint: bytes = FINGERPRINT,
                    last_used: int = NOW - 5 * 60) -> str:
    t = text.encode()
    payload = dsv4_payload(24, fingerprint=fingerprint)
    data = header(tokens=24, text_bytes=len(t), payload_bytes=len(payload), reason=1,
                  created=NOW - 50 * HOUR, last_used=last_used) + t + payload
    return write(directory, hashlib.sha1(t).hexdigest(), data)


def ds4_file(directory: Path) -> str:
    """What ds4-server writes: model 0 (DeepSeek V4 Flash), payload ABI 2, 2-bit experts."""
    t = DS4_TEXT.encode()
    payload = dsv4_payload(10240, fingerprint=None, body=300)
    data = header(tokens=10240, text_bytes=len(t), payload_bytes=len(payload), reason=2, model=FLASH,
                  abi=ABI_DS4, quant=2, hits=12, ctx=65536, created=NOW - 9 * 24 * HOUR,
                  last_used=NOW - 30 * HOUR) + t + payload
    return write(directory, hashlib.sha1(t).hexdigest(), data)


def corrupt_file(directory: Path) -> str:
    """Header promises a 4096-byte payload; the file stops 100 bytes into it."""
    t = CORRUPT_TEXT.encode()
    data = header(tokens=512, text_bytes=len(t), payload_bytes=4096, reason=3,
                  created=NOW - 4 * HOUR, last_used=NOW - 4 * HOUR) + t + bytes(100)
    return write(directory, hashlib.sha1(t).hexdigest(), data)


def fixture_dir(directory: Path) -> dict[str, str]:
    """The four kinds of file the snapshot shows; returns name -> SHA."""
    return {
        "titled": titled_session(directory, pinned=True),
        "cold": cold_checkpoint(directory),
        "ds4": ds4_file(directory),
        "corrupt": corrupt_file(directory),
    }


if __name__ == "__main__":  # `python tests/ui/kv_fixtures.py DIR`: a directory to browse by hand
    import sys

    print(fixture_dir(Path(sys.argv[1])))
