"""The limit annotation's decision (memslice.elastic.limit_mib): per-container key wins over the pod-wide one,
absent means not elastic, and every bad value is refused with a message naming the annotation and the fix."""

from __future__ import annotations

import pytest

from memslice.elastic import LimitAnnotationError, limit_mib, parse_limit_record, pod_limits


def test_absent_means_not_elastic():
    assert limit_mib({}, "nb", 2048) is None
    assert limit_mib({"memslice.io/gpu-mem-limit.other": "9000"}, "nb", 2048) is None


def test_container_key_wins_over_the_pod_wide_one():
    ann = {"memslice.io/gpu-mem-limit": "4096", "memslice.io/gpu-mem-limit.nb": "8192"}
    assert limit_mib(ann, "nb", 2048) == 8192
    assert limit_mib(ann, "sidecar", 1024) == 4096
    assert limit_mib({"memslice.io/gpu-mem-limit": "2048"}, "nb", 2048) == 2048


@pytest.mark.parametrize(("value", "message"), [
    ("8GiB", "is not a whole number of MiB"),
    ("-1", "is not a whole number of MiB"),
    ("0", "is not a whole number of MiB"),
    ("٣٣٣٣", "is not a whole number of MiB"),       # non-ASCII digits: isdigit() alone would accept them
    ("99999999999999999999", "is not a whole number of MiB"),
    ("x" * 10000, "is not a whole number of MiB"),
    ("1024", "is below the container 'nb''s request of 2048 MiB"),
])
def test_bad_values_are_refused_naming_the_annotation(value, message):
    with pytest.raises(LimitAnnotationError) as err:
        limit_mib({"memslice.io/gpu-mem-limit.nb": value}, "nb", 2048)
    assert message in str(err.value) and "memslice.io/gpu-mem-limit.nb" in str(err.value)
    assert len(str(err.value)) < 300


def test_pod_limits_keeps_only_limits_above_the_request():
    ann = {"memslice.io/gpu-mem-limit": "1024", "memslice.io/gpu-mem-limit.lab": "8192"}
    assert pod_limits(ann, {"lab": 2048, "side": 1024, "small": 256}) == {"lab": 8192, "small": 1024}
    with pytest.raises(LimitAnnotationError, match="below the container 'side'"):
        pod_limits(ann, {"side": 2048})


@pytest.mark.parametrize("raw", ['{"lab": 0}', '{"lab": "8192"}', '{"lab": true}', "[8192]", "{", '{"lab": 1e3}',
                                 '{"lab": 2000000}', '{"a": 1, "pad": "' + "x" * 5000 + '"}'])
def test_the_extenders_limit_record_is_validated(raw):
    with pytest.raises(LimitAnnotationError, match="memslice.io/gpu-mem-limit-mib=") as exc:
        parse_limit_record(raw)
    assert len(str(exc.value)) < 300


def test_the_extenders_limit_record_is_read():
    assert parse_limit_record('{"lab":8192,"side":512}') == {"lab": 8192, "side": 512}
