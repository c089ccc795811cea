"""Memory sizes as people write them: `4096` (MiB), `512MiB`, `4GiB`, `4Gi`.

The same grammar is implemented in C (interposer/src/config.c) for the shim; tests check that both agree.
"""

from __future__ import annotations

import re

from . import errors

MiB = 1 << 20
_UNITS = {"": MiB, "B": 1, "KiB": 1 << 10, "Ki": 1 << 10, "MiB": MiB, "Mi": MiB,
          "GiB": 1 << 30, "Gi": 1 << 30, "TiB": 1 << 40, "Ti": 1 << 40}
_SIZE = re.compile(r"^[ \t]*([0-9]+) *([A-Za-z]*)[ \t\n]*$")
HELP = "a whole number of MiB (4096) or a number with a binary unit: 512MiB, 4GiB, 4Gi, 1TiB"


class SizeError(errors.InputError):
    """A size string that cannot be read; the message names the value and a valid form."""


def parse_size(text: str, *, what: str = "size", allow_zero: bool = False) -> int:
    """Return the size in bytes; raise SizeError naming `what`, the bad value and a valid form."""
    m = _SIZE.match(text or "")
    if not m or m.group(2) not in _UNITS:
        raise SizeError(f"{what}={text!r} is not a valid size{size_hint(text)}; use {HELP}")
    value = int(m.group(1)) * _UNITS[m.group(2)]
    if value >= 1 << 64:
        raise SizeError(f"{what}={text!r} is too large; use {HELP}")
    if value <= 0 and not allow_zero:
        raise SizeError(f"{what}={text!r} is zero; use {HELP}")
    return value


def size_hint(text: str | None) -> str:
    """Why a size string people write is not one, when there is a common reason (else empty)."""
    t = (text or "").strip()
    m = _SIZE.match(t)
    if m and m.group(2).upper() in {"KB", "MB", "GB", "TB", "K", "M", "G", "T"}:
        return f" (decimal units are ambiguous; write {m.group(1)}{m.group(2)[0].upper()}iB)"
    if t.startswith("-"):
        return " (a size cannot be negative)"
    if re.fullmatch(r"[0-9]+[.,][0-9]+ *[A-Za-z]*", t):
        return " (whole numbers only: write 1536MiB, not 1.5GiB)"
    return ""


def format_bytes(n: int) -> str:
    """Short human form: 4.0GiB, 512MiB, 12KiB."""
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", MiB), ("KiB", 1 << 10)):
        if abs(n) >= size:
            v = n / size
            return f"{v:.1f}{unit}" if v < 100 and v != int(v) else f"{int(round(v))}{unit}"
    return f"{n}B"
