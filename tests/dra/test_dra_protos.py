"""The DRA and plugin-registration stubs speak the kubelet's wire format.

The expected tables below are copied from the upstream .proto files (kubernetes/kubernetes, read on
2026-11-23):
- staging/src/k8s.io/kubelet/pkg/apis/dra/v1/api.proto @ 53eddfd35a505617fd0d6485d2b858b69cff8223
- staging/src/k8s.io/kubelet/pkg/apis/dra/v1beta1/api.proto @ 23c0d4e0cc032fd4e9f7984f0d16aed68fc1bd33
- staging/src/k8s.io/kubelet/pkg/apis/pluginregistration/v1/api.proto @ 56e225f4b8de5d1c920d6b67829ee3e0f0ae1d62
- kubernetes/kubelet (the staging copy) @ 63b3249724f7d89a8aa48f9acb3811f193c9aa68, read on 2026-11-28:
  pkg/apis/dra/v1/api.proto (Device gained `optional string share_id = 5`), pkg/apis/dra-health/v1 and
  v1alpha1 (DeviceHealth gained health_check_timeout_seconds = 4 and message = 5), dra-health/v1/types.go
  `DRAResourceHealthService = "v1.DRAResourceHealth"`; kubernetes/kubernetes
  staging/src/k8s.io/kubelet/pkg/apis/dra-health/v1beta1/api.proto @ 712b43e45f9f71cb122f415d7da6bd1e75621bc2
  (the same messages, package v1beta1)
- the service names the kubelet expects in supported_versions: dra/v1/types.go `DRAPluginService =
  "v1.DRAPlugin"`, dra/v1beta1/types.go `"v1beta1.DRAPlugin"`; pluginregistration/v1/constants.go
  `DRAPlugin = "DRAPlugin"`; pkg/kubelet/cm/dra/plugin `servicesSupportedByKubelet` = [v1, v1beta1] since
  1.34 (PR #132700), picking the first of the plugin's list it supports.
They are compared with the descriptors of the generated Python modules (what goes on the wire).
"""

from __future__ import annotations

import pytest
from google.protobuf.descriptor import FieldDescriptor as F

from memslice.plugin.dra.registration import PLUGIN_TYPE
from memslice.plugin.dra.server import SERVICES
from memslice.proto import (
    dra_health_v1_pb2,
    dra_health_v1alpha1_pb2,
    dra_health_v1beta1_pb2,
    dra_v1_pb2,
    dra_v1beta1_pb2,
    pluginregistration_pb2,
)

S, B, M, I64, E = "string", "bool", "message", "int64", "enum"
REP, MAP = "repeated", "map"

# message -> [(number, name, type, label)]
DRA_FIELDS = {
    "NodePrepareResourcesRequest": [(1, "claims", "Claim", REP)],
    "NodePrepareResourcesResponse": [(1, "claims", "NodePrepareResourceResponse", MAP)],
    "NodePrepareResourceResponse": [(1, "devices", "Device", REP), (2, "error", S, "")],
    "Device": [(1, "request_names", S, REP), (2, "pool_name", S, ""), (3, "device_name", S, ""),
               (4, "cdi_device_ids", S, REP)],
    "NodeUnprepareResourcesRequest": [(1, "claims", "Claim", REP)],
    "NodeUnprepareResourcesResponse": [(1, "claims", "NodeUnprepareResourceResponse", MAP)],
    "NodeUnprepareResourceResponse": [(1, "error", S, "")],
    "Claim": [(1, "namespace", S, ""), (2, "uid", S, ""), (3, "name", S, "")],
}
DRA_METHODS = {"NodePrepareResources": ("NodePrepareResourcesRequest", "NodePrepareResourcesResponse"),
               "NodeUnprepareResources": ("NodeUnprepareResourcesRequest", "NodeUnprepareResourcesResponse")}
REG_FIELDS = {
    "PluginInfo": [(1, "type", S, ""), (2, "name", S, ""), (3, "endpoint", S, ""),
                   (4, "supported_versions", S, REP)],
    "RegistrationStatus": [(1, "plugin_registered", B, ""), (2, "error", S, "")],
    "RegistrationStatusResponse": [],
    "InfoRequest": [],
}
REG_METHODS = {"GetInfo": ("InfoRequest", "PluginInfo"),
               "NotifyRegistrationStatus": ("RegistrationStatus", "RegistrationStatusResponse")}


def _table(msg) -> list[tuple[int, str, str, str]]:
    out = []
    for f in msg.fields:
        if f.type == F.TYPE_MESSAGE:
            if f.message_type.GetOptions().map_entry:
                typ, label = f.message_type.fields_by_name["value"].message_type.name, MAP
            else:
                typ, label = f.message_type.name, REP if f.is_repeated else ""
        else:
            typ = {F.TYPE_STRING: S, F.TYPE_BOOL: B, F.TYPE_INT64: I64}.get(f.type) or (
                f.enum_type.name if f.type == F.TYPE_ENUM else "?")
            label = REP if f.is_repeated else ""
        out.append((f.number, f.name, typ, label))
    return sorted(out)


def _check(module, package: str, fields: dict, service: str, methods: dict) -> None:
    desc = module.DESCRIPTOR
    assert desc.package == package
    for name, want in fields.items():
        assert _table(desc.message_types_by_name[name]) == sorted(want), name
    svc = desc.services_by_name[service]
    assert svc.full_name == f"{package}.{service}"
    got = {m.name: (m.input_type.name, m.output_type.name) for m in svc.methods}
    assert got == methods
    assert all(not m.client_streaming and not m.server_streaming for m in svc.methods)


@pytest.mark.parametrize("module,version", [(dra_v1_pb2, "v1"), (dra_v1beta1_pb2, "v1beta1")])
def test_dra_service_matches_upstream(module, version) -> None:
    fields = DRA_FIELDS
    if version == "v1":  # issue 36.7: share_id (proto3 optional: a field of a one-field oneof)
        fields = {**DRA_FIELDS, "Device": [*DRA_FIELDS["Device"], (5, "share_id", S, "")]}
        assert module.DESCRIPTOR.message_types_by_name["Device"].fields_by_name["share_id"].has_presence
    _check(module, f"k8s.io.kubelet.pkg.apis.dra.{version}", fields, "DRAPlugin", DRA_METHODS)


def test_registration_service_matches_upstream() -> None:
    _check(pluginregistration_pb2, "pluginregistration", REG_FIELDS, "Registration", REG_METHODS)


def test_advertised_services_are_the_kubelets_names_newest_first() -> None:
    assert SERVICES == ("v1.DRAPlugin", "v1beta1.DRAPlugin", "v1.DRAResourceHealth", "v1beta1.DRAResourceHealth",
                        "v1alpha1.DRAResourceHealth")
    # a health service's advertised name is its gRPC service name (dra-health/<version>/types.go)
    for module, name in zip((dra_health_v1_pb2, dra_health_v1beta1_pb2, dra_health_v1alpha1_pb2), SERVICES[2:],
                            strict=True):
        assert module.DESCRIPTOR.services_by_name["DRAResourceHealth"].full_name == name
    assert PLUGIN_TYPE == "DRAPlugin"


# staging/src/k8s.io/kubelet/pkg/apis/dra-health/v1alpha1/api.proto @ c4b5de207d1f469249888c498a965c58443e6964
HEALTH_FIELDS = {
    "NodeWatchResourcesRequest": [],
    "DeviceIdentifier": [(1, "pool_name", S, ""), (2, "device_name", S, "")],
    "DeviceHealth": [(1, "device", "DeviceIdentifier", ""), (2, "health", "HealthStatus", ""),
                     (3, "last_updated_time", I64, ""), (4, "health_check_timeout_seconds", I64, ""),
                     (5, "message", S, "")],
    "NodeWatchResourcesResponse": [(1, "devices", "DeviceHealth", REP)],
}


@pytest.mark.parametrize("module,version", [(dra_health_v1alpha1_pb2, "v1alpha1"),
                                            (dra_health_v1beta1_pb2, "v1beta1"), (dra_health_v1_pb2, "v1")])
def test_health_service_matches_upstream(module, version) -> None:
    desc = module.DESCRIPTOR
    assert desc.package == version
    for name, want in HEALTH_FIELDS.items():
        assert _table(desc.message_types_by_name[name]) == sorted(want), name
    enum = desc.enum_types_by_name["HealthStatus"]
    assert {v.name: v.number for v in enum.values} == {"UNKNOWN": 0, "HEALTHY": 1, "UNHEALTHY": 2}
    svc = desc.services_by_name["DRAResourceHealth"]
    [m] = svc.methods
    assert (m.name, m.input_type.name, m.output_type.name) == ("NodeWatchResources", "NodeWatchResourcesRequest",
                                                               "NodeWatchResourcesResponse")
    assert not m.client_streaming and m.server_streaming
