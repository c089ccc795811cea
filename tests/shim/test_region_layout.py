"""Python (cffi) and C read the shared region through the same header; their layouts must agree."""

from __future__ import annotations

import subprocess

from memslice.interposer.region import _ffi, layout


def test_cffi_layout_matches_the_c_compiler(libs, tmp_path):
    probe = tmp_path / "probe.c"
    probe.write_text("""
        #include <stddef.h>
        #include <stdio.h>
        #include "memslice_region.h"
        int main(void) {
            printf("%zu %zu %zu %zu %zu %zu %zu %zu %zu %d\\n", sizeof(struct ms_header), sizeof(struct ms_device),
                   sizeof(struct ms_slot), sizeof(struct ms_region), offsetof(struct ms_device, used),
                   offsetof(struct ms_device, peak), offsetof(struct ms_slot, device_bytes),
                   offsetof(struct ms_header, slot_hwm), offsetof(struct ms_slot, driver_taken), MS_VERSION);
            return 0;
        }""")
    exe = tmp_path / "probe"
    subprocess.run(["cc", f"-I{libs.include}", str(probe), "-o", str(exe)], check=True)
    c_view = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split()
    ffi = _ffi()
    py_view = [ffi.sizeof("struct ms_header"), ffi.sizeof("struct ms_device"), ffi.sizeof("struct ms_slot"),
               ffi.sizeof("struct ms_region"), ffi.offsetof("struct ms_device", "used"),
               ffi.offsetof("struct ms_device", "peak"), ffi.offsetof("struct ms_slot", "device_bytes"),
               ffi.offsetof("struct ms_header", "slot_hwm"), ffi.offsetof("struct ms_slot", "driver_taken"),
               layout().version]
    assert [int(x) for x in c_view] == py_view
    assert py_view[4] % 64 == 0  # the hot counter starts its own cache line
