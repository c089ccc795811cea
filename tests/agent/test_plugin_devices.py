"""Device IDs and the exact size of a ListAndWatch message (checked against real protobuf encoding)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memslice.plugin.deviceplugin.devices import (
    HEALTHY,
    KUBELET_MAX_MESSAGE_BYTES,
    UNHEALTHY,
    DeviceIdError,
    GpuShape,
    ListTooLarge,
    check_list_fits,
    device_id,
    list_and_watch_bytes,
    parse_device_id,
    smallest_fitting_unit,
    worst_case_bytes,
)
from memslice.plugin.deviceplugin.state import build_device_list
from memslice.plugin.gpu.nvml import GpuInfo

GiB = 1024


@given(st.integers(0, 9999), st.integers(0, 10**9 - 1))
def test_device_id_round_trips(gpu, n):
    assert parse_device_id(device_id(gpu, n)) == (gpu, n)


@pytest.mark.parametrize("bad", ["", "g", "g0", "g0-", "gx-1", "GPU-abc-1", "g0-1-2", "g-1", " g0-1",
                                 "g0-1\n", "g\u0663-1"])
def test_foreign_ids_are_rejected_by_name(bad):
    with pytest.raises(DeviceIdError, match="not a memslice device ID"):
        parse_device_id(bad)


shapes = st.lists(st.builds(GpuShape, index=st.integers(0, 15), mem_mib=st.integers(0, 2500),
                            numa=st.one_of(st.none(), st.integers(-1, 300))),
                  min_size=1, max_size=3, unique_by=lambda g: g.index)


@settings(max_examples=60, deadline=None)
@given(shapes, st.integers(1, 9), st.sampled_from([HEALTHY, UNHEALTHY]))
def test_computed_size_equals_the_serialized_message(gpus, unit, health):
    infos = [GpuInfo(index=g.index, uuid=f"GPU-{g.index}", model="m", mem_mib=g.mem_mib, numa=g.numa,
                     mig=False) for g in gpus]
    healthy = {i.uuid: health == HEALTHY for i in infos}
    msg = build_device_list(infos, healthy, unit)
    assert list_and_watch_bytes(gpus, unit, health=health) == msg.ByteSize()


def test_one_80gib_gpu_fits_at_one_mib():
    assert check_list_fits([GpuShape(0, 80 * GiB, 0)], 1) < KUBELET_MAX_MESSAGE_BYTES


def test_eight_80gib_gpus_fail_and_name_the_unit_that_fits():
    gpus = [GpuShape(i, 80 * GiB, i // 4) for i in range(8)]
    with pytest.raises(ListTooLarge) as exc:
        check_list_fits(gpus, 1)
    fit = smallest_fitting_unit(gpus)
    assert fit > 1
    assert f"--unit-mib {fit}" in str(exc.value) and "4194304" in str(exc.value)
    assert worst_case_bytes(gpus, fit) <= KUBELET_MAX_MESSAGE_BYTES < worst_case_bytes(gpus, fit - 1)
    check_list_fits(gpus, fit)


def test_unhealthy_list_is_the_worst_case():
    gpus = [GpuShape(0, 1000, 1)]
    assert worst_case_bytes(gpus, 1) == list_and_watch_bytes(gpus, 1) + 2 * 1000
