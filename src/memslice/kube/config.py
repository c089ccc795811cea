"""The one way the node agent, the scheduler extender and `memslice extender-certs` find the Kubernetes API.

Fallback order (docs/architecture.md, "Contracts"):
1. the kubeconfig file named by the caller (their --kubeconfig flag, which defaults to $KUBECONFIG);
2. the in-cluster service account, when KUBERNETES_SERVICE_HOST is set (a pod);
3. ~/.kube/config, when that file exists;
4. none: (None, why). The agent then runs standalone; the extender and extender-certs refuse to start.
A configuration that is found but broken (unreadable file, a pod without its token) raises: it is never
skipped for the next source.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

DEFAULT_KUBECONFIG = "~/.kube/config"


def load_api_client(kubeconfig: str | None, *, pool_maxsize: int | None = None
                    ) -> tuple[ApiClient | None, str]:
    """An ApiClient and how it was found, or (None, why none was). `pool_maxsize` sizes urllib3's
    connection pool (the extender binds concurrently)."""
    from kubernetes import client, config

    conf = client.Configuration()
    home = Path(DEFAULT_KUBECONFIG).expanduser()
    if kubeconfig:
        config.load_kube_config(config_file=kubeconfig, client_configuration=conf)
        how = f"kubeconfig {kubeconfig}"
    elif os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config(client_configuration=conf)
        how = "in-cluster service account"
    elif home.is_file():
        config.load_kube_config(config_file=str(home), client_configuration=conf)
        how = f"kubeconfig {home}"
    else:
        return None, (f"no kubeconfig (--kubeconfig, KUBECONFIG, {DEFAULT_KUBECONFIG}) and not in a cluster "
                      f"(KUBERNETES_SERVICE_HOST unset)")
    if pool_maxsize is not None:
        conf.connection_pool_maxsize = pool_maxsize
    return client.ApiClient(conf), how
