"""`memslice node-agent` flags and environment: precedence, and bad values refused with the fix named."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from memslice.cli import build_parser, main
from memslice.plugin.config import OPTIONS, add_arguments, resolve


def parse(argv: list[str], env: dict[str, str] | None = None):
    p = argparse.ArgumentParser()
    add_arguments(p)
    return resolve(p.parse_args(argv), env or {})


def test_defaults_follow_the_kubelet_and_architecture_contracts():
    cfg = parse([])
    assert cfg.device_plugin_dir == Path("/var/lib/kubelet/device-plugins")
    assert cfg.pod_resources_socket == Path("/var/lib/kubelet/pod-resources/kubelet.sock")
    assert cfg.shim_host_dir == Path("/var/lib/memslice/lib")
    assert cfg.region_root == Path("/var/lib/memslice/regions")
    assert (cfg.elastic_dir, cfg.idle_after_s) == (Path("/var/lib/memslice/elastic"), 300.0)
    assert cfg.swap_event_interval_s == 60.0
    assert parse([], {"MEMSLICE_SWAP_EVENT_INTERVAL_S": "5"}).swap_event_interval_s == 5.0
    assert parse(["--region-root", "/data/regions"]).elastic_dir == Path("/data/elastic")
    assert (cfg.unit_mib, cfg.preload, cfg.visibility, cfg.simulate) == (1, "file", "env", False)
    assert cfg.ignored_xids == frozenset({13, 31, 43, 45, 68, 109})


def test_flags_win_over_environment():
    env = {"MEMSLICE_UNIT_MIB": "8", "MEMSLICE_PRELOAD": "env", "NODE_NAME": "n1"}
    cfg = parse(["--unit-mib", "16"], env)
    assert (cfg.unit_mib, cfg.preload, cfg.node_name) == (16, "env", "n1")


def test_simulator_is_selected_by_flag_or_environment():
    assert parse(["--simulate"]).simulate and parse(["--simulate"]).sim_gpus is None
    assert parse(["--simulate", "80GiB:1"]).sim_gpus == "80GiB:1"
    cfg = parse([], {"MEMSLICE_SIM_GPUS": "16GiB,24GiB:1"})
    assert cfg.simulate and cfg.sim_gpus == "16GiB,24GiB:1"
    assert parse(["--pod-resources-socket", ""]).pod_resources_socket is None
    assert parse(["--ignored-xids", "none"]).ignored_xids == frozenset()


@pytest.mark.parametrize("argv, env, words", [
    (["--unit-mib", "0"], {}, ["--unit-mib='0'", "whole number of MiB"]),
    ([], {"MEMSLICE_UNIT_MIB": "1GiB"}, ["MEMSLICE_UNIT_MIB='1GiB'"]),
    (["--preload", "ld"], {}, ["--preload='ld'", "file, env"]),
    (["--visibility", "all"], {}, ["--visibility='all'", "env, cdi"]),
    (["--ignored-xids", "13,x"], {}, ["--ignored-xids='13,x'", "comma list of Xid numbers"]),
    (["--metrics-port", "70000"], {}, ["--metrics-port='70000'", "TCP port"]),
    (["--health-recovery-s", "-1"], {}, ["--health-recovery-s='-1'", "seconds"]),
    (["--grpc-workers", "1"], {}, ["--grpc-workers='1'", "(4..256)"]),
    (["--idle-after", "1e9"], {}, ["--idle-after='1e9'", "seconds (0..604800)"]),
    ([], {"MEMSLICE_IDLE_AFTER_S": "soon"}, ["MEMSLICE_IDLE_AFTER_S='soon'", "seconds"]),
    (["--swap-event-interval-s", "0.1"], {}, ["--swap-event-interval-s='0.1'", "seconds (>= 1)"]),
    (["--swap-event-interval-s", "1e6"], {}, ["--swap-event-interval-s='1e6'", "seconds (1..86400)"]),
    ([], {"MEMSLICE_AGENT_LOG_LEVEL": "loud"}, ["MEMSLICE_AGENT_LOG_LEVEL='loud'", "debug, info"]),
])
def test_bad_values_exit_2_naming_the_value_and_the_fix(argv, env, words, monkeypatch, capsys, tmp_path):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("MEMSLICE_DEVICE_PLUGIN_DIR", str(tmp_path / "dp"))
    assert main(["node-agent", *argv]) == 2
    err = capsys.readouterr().err
    for w in words:
        assert w in err
    assert not (tmp_path / "dp").exists()  # nothing started


def test_help_documents_every_flag_and_environment_variable():
    sub = build_parser()._subparsers._group_actions[0].choices["node-agent"]  # type: ignore[union-attr]
    text = sub.format_help()
    for o in OPTIONS:
        assert o.flag in text and o.env in text
    assert "--simulate" in text and "MEMSLICE_SIM_STATE" in text and "4 MiB" in text


def test_probe_port_is_off_unless_given_and_refused_by_name_when_bad(monkeypatch, capsys, tmp_path):
    """--probe-port (issue 35: the kubelet's probes on a port of their own): none by default, 0 for any."""
    assert parse([]).probe_port is None
    assert parse(["--probe-port", "9401"]).probe_port == 9401
    assert parse([], {"MEMSLICE_PROBE_PORT": "0"}).probe_port == 0
    monkeypatch.setenv("MEMSLICE_DEVICE_PLUGIN_DIR", str(tmp_path / "dp"))
    assert main(["node-agent", "--probe-port", "http"]) == 2
    assert "--probe-port='http'" in capsys.readouterr().err
