"""deploy/overlays/dra's claim policy (memslice-claims-one-gpu) on the real kube-apiserver: every case of
tests/dra/test_dra_admission.py, where cel-python evaluates the CEL, sent as a dry-run create of a ResourceClaim
and of a ResourceClaimTemplate. The API server's own CEL, matching, variable order, object validation and
message formatting decide here; admitted cases must be stored (dry run), refused ones answered 422 naming the
policy's message. Found here: a claim without requests reaches CEL with `requests: null`, which the policy
refused by failing to evaluate (cel-python admitted it); and adminAccess is refused by the API server itself
outside a namespace labelled resource.kubernetes.io/admin-access."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest
from kube_real import RealCluster, wait_until
from test_dra_admission import ADMITTED, REFUSED, template
from test_real_deploy import deploy

# one real control plane (the session fixture real_cluster) serves the test_real_* modules: one xdist worker
pytestmark = [pytest.mark.timeout(600), pytest.mark.xdist_group("kube")]
NS = "real-claim-policy"
# the API server refuses adminAccess itself outside a namespace labelled for it; there our policy decides
ADMIN_NS = "real-claim-policy-admin"
POLICY_DELAY_S = 60  # a new policy reaches the API server's admission through an informer


def create(cluster: RealCluster, obj: dict[str, Any], ns: str = NS) -> tuple[int, str]:
    obj = copy.deepcopy(obj)
    obj["metadata"]["namespace"] = ns
    plural = {"ResourceClaim": "resourceclaims", "ResourceClaimTemplate": "resourceclaimtemplates"}[obj["kind"]]
    status, out = cluster.request("POST", f"/apis/resource.k8s.io/v1/namespaces/{ns}/{plural}?dryRun=All"
                                          "&fieldValidation=Strict", obj)
    message = out.get("message", "") if isinstance(out, dict) else str(out)
    return status, " ".join(message.split())


@pytest.fixture(scope="module")
def cluster(real_cluster: RealCluster) -> Iterator[RealCluster]:
    deploy(real_cluster, "overlays/dra")
    real_cluster.ensure_namespace(NS)
    status, out = real_cluster.request("POST", "/api/v1/namespaces", {"metadata": {
        "name": ADMIN_NS, "labels": {"resource.kubernetes.io/admin-access": "true"}}})
    assert status in (201, 409), out
    first, _ = REFUSED["count 17"]
    wait_until("the claim policy in force", lambda: create(real_cluster, first)[0] == 422, POLICY_DELAY_S, 0.5)
    yield real_cluster


WRAPS = {"claim": lambda c: c, "template": template}


@pytest.mark.parametrize("what", list(ADMITTED))
@pytest.mark.parametrize("wrap", list(WRAPS))
def test_claims_the_agent_prepares_are_admitted_by_the_real_api_server(cluster, what, wrap) -> None:
    status, message = create(cluster, WRAPS[wrap](ADMITTED[what]))
    assert status == 201, (status, message)


@pytest.mark.parametrize("what", list(REFUSED))
@pytest.mark.parametrize("wrap", list(WRAPS))
def test_claims_the_agent_would_refuse_are_refused_by_the_real_api_server(cluster, what, wrap) -> None:
    obj, want = REFUSED[what]
    admin = what == "admin access"
    status, message = create(cluster, WRAPS[wrap](obj), ADMIN_NS if admin else NS)
    assert status == 422 and "memslice-claims-one-gpu" in message and want in message, (status, message)
    if admin:  # elsewhere the API server's own validation refuses it first
        status, message = create(cluster, WRAPS[wrap](obj))
        assert status == 422 and "admin-access: true` label on the containing namespace" in message, message
