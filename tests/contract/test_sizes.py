"""The size grammar is implemented twice (Python for the CLI and the node agent, C for the shim); both
must accept and refuse exactly the same strings."""

from __future__ import annotations

import subprocess

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memslice.sizes import SizeError, format_bytes, parse_size

UNITS = ["", "B", "KiB", "Ki", "MiB", "Mi", "GiB", "Gi", "TiB", "Ti", "GB", "gib", "M", "k", "iB"]


def test_examples():
    assert parse_size("4096") == 4096 << 20
    assert parse_size("512MiB") == 512 << 20
    assert parse_size("4GiB") == parse_size("4Gi") == 4 << 30
    with pytest.raises(SizeError, match="decimal units are ambiguous"):
        parse_size("4GB", what="--gpu-mem")
    with pytest.raises(SizeError, match=r"--gpu-mem='0' is zero"):
        parse_size("0", what="--gpu-mem")
    assert format_bytes(3 << 30) == "3GiB" and format_bytes(1536 << 20) == "1.5GiB"


def python_view(s: str) -> str:
    try:
        return str(parse_size(s))
    except SizeError:
        return "invalid"


size_strings = st.one_of(
    st.builds(lambda n, sp, u, tail: f"{n}{sp}{u}{tail}", st.integers(0, 2**66), st.sampled_from(["", " "]),
              st.sampled_from(UNITS), st.sampled_from(["", " ", "\t", "x", ".5"])),
    st.text(alphabet="0123456789 .-+GMKiBTb\t", max_size=12),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(size_strings, min_size=1, max_size=40))
def test_c_and_python_agree(cbin, strings):
    strings = [s for s in strings if "\n" not in s]
    out = subprocess.run([cbin["sizecheck"]], input="".join(s + "\n" for s in strings), capture_output=True,
                         text=True, check=True)
    assert out.stdout.splitlines() == [python_view(s) for s in strings]
