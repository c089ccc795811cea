"""Container images for the real node (tests/support/kube_node.py), assembled from files on this machine: no registry.

An image is one uncompressed layer (a tar of the files given), its OCI config and manifest, in an OCI image
layout archive (oci-layout, index.json, blobs/sha256/...) that `ctr images import` reads; the index names the
image (io.containerd.image.name) so that it is imported under that reference, as if pulled.

- the pause image: a static C program that waits for SIGTERM/SIGINT (what registry.k8s.io/pause does);
- the test image: the C test programs (tests/c) with this machine's own dynamic loader and libraries, and
  /bin/sh and sleep; no CUDA driver (the node agent mounts the simulated one at Allocate, as a real node's
  runtime would mount the real one).
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import subprocess
import tarfile
from pathlib import Path

PAUSE_IMAGE = "registry.k8s.io/pause:3.10"  # containerd 2.x's default sandbox image: no config needed for it
TEST_IMAGE = "memslice.test/cuda-client:1"

PAUSE_C = r"""
#include <signal.h>
#include <unistd.h>
static void done(int sig) { (void)sig; _exit(0); }
int main(void) {
    signal(SIGTERM, done);
    signal(SIGINT, done);
    for (;;) pause();
}
"""


def _blob(blobs: dict[str, bytes], data: bytes) -> dict[str, object]:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    blobs[digest] = data
    return {"digest": digest, "size": len(data)}


def _layer(files: dict[str, Path | bytes]) -> bytes:
    """One layer: each image path with its parent directories, files with their mode (0755 for programs)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        dirs: set[str] = set()
        for path in sorted(files):
            parts = path.strip("/").split("/")
            for i in range(1, len(parts)):
                d = "/".join(parts[:i])
                if d not in dirs:
                    dirs.add(d)
                    info = tarfile.TarInfo(d)
                    info.type, info.mode = tarfile.DIRTYPE, 0o755
                    tar.addfile(info)
            src = files[path]
            data = src if isinstance(src, bytes) else src.read_bytes()
            info = tarfile.TarInfo("/".join(parts))
            info.size, info.mode = len(data), 0o755
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def oci_archive(out: Path, name: str, files: dict[str, Path | bytes], entrypoint: list[str]) -> Path:
    """Write the OCI image layout archive of an image `name` with these files (image path: host file or
    bytes) and this entrypoint, for linux/amd64."""
    blobs: dict[str, bytes] = {}
    layer = _layer(files)
    layer_desc = {"mediaType": "application/vnd.oci.image.layer.v1.tar", **_blob(blobs, layer)}
    config = {"architecture": "amd64", "os": "linux",
              "config": {"Entrypoint": entrypoint, "Env": ["PATH=/bin"], "WorkingDir": "/"},
              "rootfs": {"type": "layers", "diff_ids": [layer_desc["digest"]]}}
    config_desc = {"mediaType": "application/vnd.oci.image.config.v1+json",
                   **_blob(blobs, json.dumps(config).encode())}
    manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": config_desc, "layers": [layer_desc]}
    manifest_desc = {"mediaType": "application/vnd.oci.image.manifest.v1+json",
                     **_blob(blobs, json.dumps(manifest).encode()),
                     "platform": {"architecture": "amd64", "os": "linux"},
                     "annotations": {"io.containerd.image.name": name,
                                     "org.opencontainers.image.ref.name": name.rsplit(":", 1)[1]}}
    index = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
             "manifests": [manifest_desc]}
    with tarfile.open(out, "w") as tar:
        for member, data in [("oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode()),
                             ("index.json", json.dumps(index).encode())] + \
                [(f"blobs/sha256/{d.split(':', 1)[1]}", b) for d, b in blobs.items()]:
            info = tarfile.TarInfo(member)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out


def pause_archive(workdir: Path) -> Path:
    src, exe = workdir / "pause.c", workdir / "pause"
    src.write_text(PAUSE_C)
    subprocess.run(["cc", "-O2", "-static", str(src), "-o", str(exe)], check=True, timeout=120)
    return oci_archive(workdir / "pause.tar", PAUSE_IMAGE, {"/pause": exe}, ["/pause"])


def shared_libs(program: Path) -> list[Path]:
    """The shared objects `program` loads on this machine (ldd), the dynamic loader included."""
    out = subprocess.run(["ldd", str(program)], capture_output=True, text=True, timeout=60, check=True).stdout
    libs = []
    for line in out.splitlines():
        parts = line.split()
        path = parts[2] if "=>" in parts and len(parts) > 2 else parts[0]
        if path.startswith("/"):
            libs.append(Path(path))
    return libs


def client_archive(workdir: Path, programs: dict[str, str], mounted: list[Path]) -> Path:
    """The test image: `programs` (name: host path; linked against libcuda.so.1, which is not copied: the
    node agent mounts the simulated driver) as /bin/<name>, with /bin/sh, sleep and cat, and the libraries
    they load and those that the `mounted` libraries (the shim, the simulated driver) load."""
    tools = {"sh": shutil.which("sh"), "sleep": shutil.which("sleep"), "cat": shutil.which("cat")}
    files: dict[str, Path | bytes] = {}
    for name, path in {**tools, **programs}.items():
        assert path, f"{name} not found on this machine"
        files[f"/bin/{name}"] = Path(path)
    for host in [*(Path(p) for p in {**tools, **programs}.values() if p), *mounted]:
        for lib in shared_libs(host):
            if not lib.name.startswith(("libcuda", "libnvidia-ml")):  # the simulated driver: mounted
                files[str(lib)] = lib.resolve()
                files[str(lib.resolve())] = lib.resolve()
    files["/etc/passwd"] = b"root:x:0:0:root:/:/bin/sh\n"
    return oci_archive(workdir / "test-image.tar", TEST_IMAGE, files, ["/bin/sh"])
