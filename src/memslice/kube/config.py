"""The one way the node agent, the scheduler extender and `memslice extender-certs` find the Kubernetes API.

Fallback order (docs/architecture.md, "Contracts"):
1. the kubeconfig file named by the caller (their --kubeconfig flag, which defaults to $KUBECONFIG);
2. the in-cluster service account, when KUBERNETES_SERVICE_HOST is set (a pod);
3. ~/.kube/config, when that file exists;
4. none: (None, why). The agent then runs standalone; the extender and extender-certs refuse to start.
A configuration that is found but broken (a named file that is missing or unusable, a pod without its
token) raises (errors.ConfigError naming the file, where it is one): it is never skipped for the next source.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memslice.errors import ConfigError

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

DEFAULT_KUBECONFIG = "~/.kube/config"


def load_api_client(kubeconfig: str | None, *, pool_maxsize: int | None = None
                    ) -> tuple[ApiClient | None, str]:
    """An ApiClient and how it was found, or (None, why none was). `pool_maxsize` sizes urllib3's
    connection pool (the extender binds concurrently)."""
    home = Path(DEFAULT_KUBECONFIG).expanduser()
    if kubeconfig and not Path(kubeconfig).is_file():
        raise ConfigError(f"the kubeconfig {kubeconfig} (--kubeconfig or KUBECONFIG) is not a file: name an "
                          "existing one (`kubectl config view --raw > FILE` writes one), or unset KUBECONFIG")
    in_cluster = bool(os.environ.get("KUBERNETES_SERVICE_HOST"))
    if not kubeconfig and not in_cluster and not home.is_file():
        # decided before the client is imported: a standalone agent never uses it, and importing it costs
        # each start about half a CPU-second
        return None, (f"no kubeconfig (--kubeconfig, KUBECONFIG, {DEFAULT_KUBECONFIG}) and not in a cluster "
                      f"(KUBERNETES_SERVICE_HOST unset)")
    from kubernetes import client, config

    conf = client.Configuration()
    if kubeconfig:
        _load(config, kubeconfig, conf)
        how = f"kubeconfig {kubeconfig}"
    elif in_cluster:
        config.load_incluster_config(client_configuration=conf)
        how = "in-cluster service account"
    else:
        _load(config, str(home), conf)
        how = f"kubeconfig {home}"
    if pool_maxsize is not None:
        conf.connection_pool_maxsize = pool_maxsize
    return client.ApiClient(conf), how


def _load(config: Any, path: str, conf: Any) -> None:
    """Load a kubeconfig file into conf; ConfigError naming the file when it cannot be used (empty, not YAML,
    no current context, unreadable)."""
    try:
        config.load_kube_config(config_file=path, client_configuration=conf)
    except (config.ConfigException, ValueError, OSError) as exc:  # yaml errors are ValueErrors
        raise ConfigError(f"the kubeconfig {path} cannot be used ({exc}): check it with `kubectl --kubeconfig "
                          f"{path} config view`, or name another with --kubeconfig") from None
