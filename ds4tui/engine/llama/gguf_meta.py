"""Typed reads of a GGUF's metadata: every value the llama loader uses passes through here.

Owns the check that a key holds what the loader means to read (an integer, a number, a
string, a list of those), so that a missing required key, a value of the wrong type, text
that is not UTF-8 or a number out of range is a WeightsError naming the key and the value,
the one-line refusal the CLI, the chat and `serve` print, never a TypeError deep in the
conversion. GGUF files are untrusted input.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from ds4tui.engine.errors import WeightsError

_REQUIRED = object()  # a default meaning: the key must be there
_ABSENT = object()
_SHOWN = 60  # characters of a bad value an error quotes


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= _SHOWN else text[:_SHOWN] + "..."


def _integral(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _numeric(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


class GgufMeta:
    """fields: key -> a gguf.ReaderField (its contents() is the value) or a plain value."""

    def __init__(self, fields: Mapping[str, Any], source: str) -> None:
        self._fields = fields
        self.source = source

    def has(self, key: str) -> bool:
        return key in self._fields

    def value(self, key: str, default: Any = None) -> Any:
        """The raw value, or `default` when the key is absent."""
        field = self._fields.get(key)
        if field is None:
            return default
        contents: Callable[[], Any] | None = getattr(field, "contents", None)
        if contents is None:
            return field
        try:
            return contents()
        except Exception:  # noqa: BLE001 - gguf decodes strings as UTF-8 and arrays by declared type
            raise WeightsError(f"{self.source}: GGUF key {key} holds a value that cannot be read") from None

    def _get(self, key: str, default: Any) -> Any:
        """The value, or _ABSENT for an absent key that has a default."""
        value = self.value(key, _ABSENT)
        if value is _ABSENT and default is _REQUIRED:
            raise WeightsError(f"{self.source}: GGUF key {key} is missing")
        return value

    def _bad(self, key: str, value: Any, what: str) -> WeightsError:
        return WeightsError(f"{self.source}: GGUF key {key} = {_shown(value)} is not {what}")

    def integer(self, key: str, default: Any = _REQUIRED, *, low: int | None = None,
                high: int | None = None) -> Any:
        value = self._get(key, default)
        if value is _ABSENT:
            return default
        if not _integral(value):
            raise self._bad(key, value, "an integer")
        if (low is not None and value < low) or (high is not None and value > high):
            span = f"{low if low is not None else '...'}..{high if high is not None else '...'}"
            raise self._bad(key, value, f"in {span}")
        return int(value)

    def number(self, key: str, default: Any = _REQUIRED, *, positive: bool = False) -> Any:
        value = self._get(key, default)
        if value is _ABSENT:
            return default
        if not _numeric(value) or not math.isfinite(value):
            raise self._bad(key, value, "a finite number")
        if positive and value <= 0:
            raise self._bad(key, value, "positive")
        return value

    def _of_type(self, key: str, default: Any, kind: type, what: str) -> Any:
        value = self._get(key, default)
        if value is _ABSENT:
            return default
        if not isinstance(value, kind):
            raise self._bad(key, value, what)
        return value

    def text(self, key: str, default: Any = _REQUIRED) -> Any:
        return self._of_type(key, default, str, "a string")

    def flag(self, key: str, default: Any = _REQUIRED) -> Any:
        return self._of_type(key, default, bool, "a boolean")

    def _list(self, key: str, default: Any, ok: Callable[[Any], bool], what: str) -> Any:
        value = self._get(key, default)
        if value is _ABSENT:
            return default
        if not isinstance(value, list):
            raise self._bad(key, value, f"an array of {what}")
        for item in value:
            if not ok(item):
                raise WeightsError(f"{self.source}: GGUF key {key} holds {_shown(item)}, not {what[:-1]}")
        return value

    def strings(self, key: str, default: Any = _REQUIRED) -> Any:
        return self._list(key, default, lambda v: isinstance(v, str), "strings")

    def flags(self, key: str, default: Any = _REQUIRED) -> Any:
        return self._list(key, default, lambda v: isinstance(v, bool), "booleans")

    def integers(self, key: str, default: Any = _REQUIRED) -> Any:
        return self._list(key, default, _integral, "integers")

    def numbers(self, key: str, default: Any = _REQUIRED) -> Any:
        return self._list(key, default, _numeric, "numbers")


# ---------------------------------------------------------------- the file's layout

# GGUF value types -> bytes of one scalar (8: string, 9: array are variable).
_SCALAR_BYTES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9
_MAX_DIMS = 4  # ggml's GGML_MAX_DIMS
_MAX_NESTING = 2


@dataclass(frozen=True)
class GgufLayout:
    """What a GGUF's header says about where its tensors lie (check_layout's result)."""

    alignment: int
    data_start: int  # the first byte of tensor data (tensor offsets count from here)
    tensors: tuple[tuple[str, tuple[int, ...], int, int], ...]  # (name, dims, ggml type, offset)


def check_layout(buf, source: str) -> GgufLayout:
    """Walk a GGUF's header (key/values and tensor infos) checking every count and length
    against the bytes that remain before anything loops over it or allocates by it: gguf's
    reader trusts them (an array count flipped to 2^60 there loops and grows without end).

    Long because its readers (take, u32, value, ...) are closures over the one read position, and the
    vocabulary's loop stays on locals (it runs before the chat's UI opens)."""
    size = len(buf)
    pos = 0
    alignment = 32  # GGUF's default; `general.alignment` may set another

    def bad(what: str) -> WeightsError:
        return WeightsError(f"{source}: not a readable GGUF ({what} at byte {pos})")

    def take(n: int) -> int:
        nonlocal pos
        if n < 0 or pos + n > size:
            raise bad("the file ends inside its header")
        at, pos = pos, pos + n
        return at

    def u32() -> int:
        return int.from_bytes(buf[take(4):pos], "little")

    def u64() -> int:
        return int.from_bytes(buf[take(8):pos], "little")

    def string() -> None:
        take(u64())

    def strings(count: int) -> None:
        # A tokenizer's vocabulary is 50k-260k strings: this loop, not a call per string
        # (a third of the time: the check runs before the chat's UI opens).
        nonlocal pos
        for _ in range(count):
            if pos + 8 > size:
                raise bad("the file ends inside its header")
            pos += 8 + int.from_bytes(buf[pos:pos + 8], "little")
        if pos > size:
            raise bad("the file ends inside its header")

    def value(vtype: int, depth: int) -> None:
        if vtype in _SCALAR_BYTES:
            take(_SCALAR_BYTES[vtype])
        elif vtype == _STRING:
            string()
        elif vtype == _ARRAY:
            if depth >= _MAX_NESTING:
                raise bad("arrays nested too deep")
            sub, count = u32(), u64()
            if sub in _SCALAR_BYTES:
                take(count * _SCALAR_BYTES[sub])
            elif sub in (_STRING, _ARRAY):
                if count * (8 if sub == _STRING else 12) > size - pos:
                    raise bad(f"an array of {count} entries longer than the file")
                if sub == _STRING:
                    strings(count)
                else:
                    for _ in range(count):
                        value(sub, depth + 1)
            else:
                raise bad(f"value type {sub}")
        else:
            raise bad(f"value type {vtype}")

    if bytes(buf[take(4):pos]) != b"GGUF":
        raise WeightsError(f"{source}: not a GGUF file (no GGUF magic)")
    version = u32()
    if version not in (2, 3):
        raise bad(f"GGUF version {version}")
    n_tensors, n_kv = u64(), u64()
    if n_kv * 13 > size or n_tensors * 28 > size:  # the smallest key/value, tensor info
        raise bad(f"{n_kv} keys and {n_tensors} tensors in {size} bytes")
    for _ in range(n_kv):
        key = bytes(buf[take(u64()):pos])
        vtype = u32()
        if key == b"general.alignment" and vtype == 4:
            alignment = u32()
            if alignment == 0 or alignment & (alignment - 1):
                raise bad(f"general.alignment {alignment} (not a power of two)")
        else:
            value(vtype, 0)
    tensors = []
    for _ in range(n_tensors):
        name = bytes(buf[take(u64()):pos]).decode("utf-8", "replace")
        dims = u32()
        if not 1 <= dims <= _MAX_DIMS:
            raise bad(f"a tensor of {dims} dimensions")
        shape = tuple(u64() for _ in range(dims))
        ggml_type, offset = u32(), u64()
        tensors.append((name, shape, ggml_type, offset))
    data_start = -(-pos // alignment) * alignment
    return GgufLayout(alignment, data_start, tuple(tensors))


def check_extents(layout: GgufLayout, size: int, source: str, type_sizes: Mapping[int, tuple[int, int]]) -> None:
    """Every tensor's bytes lie inside the file: a download cut short, or a header that lies,
    is one line naming the tensor and the sizes (gguf's reader maps it anyway, and a numpy
    error about dtypes comes out much later). type_sizes: ggml type -> (block elements, block
    bytes), gguf's GGML_QUANT_SIZES."""
    shown = _shown
    for name, shape, ggml_type, offset in layout.tensors:
        if ggml_type not in type_sizes:
            raise WeightsError(f"{source}: tensor {shown(name)} has ggml type {ggml_type}, which this gguf"
                               " package does not know")
        block, block_bytes = type_sizes[ggml_type]
        count = math.prod(shape)
        if shape[0] % block:
            raise WeightsError(f"{source}: tensor {shown(name)} of shape {list(shape)} is not whole blocks of"
                               f" {block}")
        end = layout.data_start + offset + count // block * block_bytes
        if offset % layout.alignment:
            raise WeightsError(f"{source}: tensor {shown(name)} starts at offset {offset}, not a multiple of"
                               f" the alignment {layout.alignment}")
        if end > size:
            raise WeightsError(f"{source}: truncated: tensor {shown(name)} ends at byte {end:,}, the file has"
                               f" {size:,} (an interrupted download or copy?)")
