"""`memslice extender-certs`: a self-signed CA, the extender's server certificate and kube-scheduler's client
certificate, as two kubernetes.io/tls Secrets (the base deploy's Job runs it) or as files (--out-dir).

Why: the extender's port binds pods and writes reservations, so only the memslice scheduler may call it
(mutual TLS: the extender requires a client certificate signed by this CA; the scheduler checks the
extender's certificate against the same CA). With cert-manager, deploy/overlays/cert-manager issues the
same two Secrets instead and this Job is not deployed.

The Secrets carry the keys cert-manager writes (tls.crt, tls.key, ca.crt), so the Deployments mount either
source unchanged. Existing Secrets with one CA in both are kept (the Job is idempotent); otherwise both are
written anew from a fresh CA. The CA's private key is never stored: to rotate, delete both Secrets and run
the Job again (docs/operations.md), then restart the extender and the scheduler.
"""

from __future__ import annotations

import argparse
import base64
import datetime
import os
import sys
from dataclasses import dataclass
from typing import Any

DEFAULT_NAMESPACE = "memslice-system"
DEFAULT_SERVICE = "memslice-extender"
DEFAULT_SERVER_SECRET = "memslice-extender-tls"
DEFAULT_CLIENT_SECRET = "memslice-scheduler-extender-client"
CLIENT_NAME = "memslice-scheduler"


@dataclass(frozen=True)
class Bundle:
    """PEM texts: the CA certificate and two certificate/key pairs signed by it."""

    ca_crt: bytes
    server_crt: bytes
    server_key: bytes
    client_crt: bytes
    client_key: bytes


def service_dns_names(service: str, namespace: str) -> list[str]:
    """The names kube-scheduler may use for the Service (urlPrefix is the .svc form)."""
    return [service, f"{service}.{namespace}", f"{service}.{namespace}.svc",
            f"{service}.{namespace}.svc.cluster.local"]


def make_bundle(service: str, namespace: str, days: int, now: datetime.datetime | None = None) -> Bundle:
    """A fresh CA (P-256) and the server (serverAuth, the Service's DNS names) and client (clientAuth,
    CN=memslice-scheduler) certificates it signs, all valid for `days` days."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    start = (now or datetime.datetime.now(datetime.UTC)) - datetime.timedelta(minutes=5)  # clock skew
    end = start + datetime.timedelta(days=days)

    def name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "memslice"),
                          x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    def pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
        return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                 serialization.NoEncryption())

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = name(f"memslice extender CA ({namespace})")
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(start).not_valid_after(end)
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
          .sign(ca_key, hashes.SHA256()))

    def leaf(cn: str, usage: x509.ObjectIdentifier, dns: list[str]) -> tuple[bytes, bytes]:
        key = ec.generate_private_key(ec.SECP256R1())
        builder = (x509.CertificateBuilder().subject_name(name(cn)).issuer_name(ca_name)
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(start).not_valid_after(end)
                   .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                   .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
                   .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                                  critical=False))
        if dns:
            builder = builder.add_extension(x509.SubjectAlternativeName([x509.DNSName(d) for d in dns]),
                                            critical=False)
        cert = builder.sign(ca_key, hashes.SHA256())
        return cert.public_bytes(serialization.Encoding.PEM), pem_key(key)

    server_crt, server_key = leaf(f"{service}.{namespace}.svc", ExtendedKeyUsageOID.SERVER_AUTH,
                                  service_dns_names(service, namespace))
    client_crt, client_key = leaf(CLIENT_NAME, ExtendedKeyUsageOID.CLIENT_AUTH, [])
    return Bundle(ca.public_bytes(serialization.Encoding.PEM), server_crt, server_key, client_crt, client_key)


def secret_data(crt: bytes, key: bytes, ca: bytes) -> dict[str, str]:
    """A kubernetes.io/tls Secret's data, with ca.crt as cert-manager writes it."""
    return {k: base64.b64encode(v).decode() for k, v in (("tls.crt", crt), ("tls.key", key), ("ca.crt", ca))}


def write_files(bundle: Bundle, out_dir: str) -> list[str]:
    """The bundle as PEM files in `out_dir` (keys 0600); the paths written."""
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    for fname, data, mode in (("ca.crt", bundle.ca_crt, 0o644), ("server.crt", bundle.server_crt, 0o644),
                              ("server.key", bundle.server_key, 0o600), ("client.crt", bundle.client_crt, 0o644),
                              ("client.key", bundle.client_key, 0o600)):
        path = os.path.join(out_dir, fname)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        paths.append(path)
    return paths


def _ca_of(secret: Any) -> str | None:
    return (getattr(secret, "data", None) or {}).get("ca.crt")


def ensure_secrets(core: Any, namespace: str, service: str, server_secret: str, client_secret: str,
                   days: int) -> str:
    """Create (or renew together) the two Secrets unless both exist with one CA; what was done."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    found: dict[str, Any] = {}
    for name in (server_secret, client_secret):
        try:
            found[name] = core.read_namespaced_secret(name, namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise
    cas = {_ca_of(s) for s in found.values()}
    if len(found) == 2 and len(cas) == 1 and None not in cas:
        return f"secrets {namespace}/{server_secret} and {namespace}/{client_secret} exist with one CA; kept"
    bundle = make_bundle(service, namespace, days)
    for name, crt, key in ((server_secret, bundle.server_crt, bundle.server_key),
                           (client_secret, bundle.client_crt, bundle.client_key)):
        body = client.V1Secret(
            metadata=client.V1ObjectMeta(name=name, namespace=namespace, labels={
                "app.kubernetes.io/part-of": "memslice", "app.kubernetes.io/component": "extender-tls"}),
            type="kubernetes.io/tls", data=dict(secret_data(crt, key, bundle.ca_crt)))
        if name in found:
            core.replace_namespaced_secret(name, namespace, body)
        else:
            core.create_namespaced_secret(namespace, body)
    return (f"wrote secrets {namespace}/{server_secret} (extender) and {namespace}/{client_secret} "
            f"(kube-scheduler) from a new CA valid {days} days")


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "extender-certs", help="make the standalone extender's TLS certificates (self-signed CA, server, client)",
        description="Make a self-signed CA, the extender's server certificate (for the Service's DNS names) "
                    "and kube-scheduler's client certificate, and store them as two kubernetes.io/tls "
                    "Secrets (tls.crt, tls.key, ca.crt), or as PEM files with --out-dir. Secrets that "
                    "already exist with one CA are kept. Reaches the cluster like `memslice extender`. Only the "
                    "standalone extender needs them (deploy/components/standalone-extender: kube-scheduler reaches "
                    "it over the network); deploy/base's extender serves the scheduler on its own pod's loopback.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--namespace", default=os.environ.get("POD_NAMESPACE", DEFAULT_NAMESPACE),
                   help="namespace of the Secrets and the Service ($POD_NAMESPACE)")
    p.add_argument("--service", default=DEFAULT_SERVICE, help="the extender's Service (the server's DNS names)")
    p.add_argument("--server-secret", default=DEFAULT_SERVER_SECRET, help="Secret the extender mounts")
    p.add_argument("--client-secret", default=DEFAULT_CLIENT_SECRET, help="Secret kube-scheduler mounts")
    p.add_argument("--days", type=int, default=3650, help="validity of the CA and both certificates")
    p.add_argument("--out-dir", help="write ca.crt, server.crt/.key, client.crt/.key here instead of Secrets")
    p.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"),
                   help="kubeconfig file ($KUBECONFIG); default: in-cluster config, then ~/.kube/config")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if not 1 <= int(args.days) <= 36500:
        print(f"memslice extender-certs: --days={args.days} is out of range; give 1..36500", file=sys.stderr)
        return 2
    if args.out_dir is not None:
        if not args.out_dir.strip():
            print("memslice extender-certs: --out-dir '' is empty; name a directory for the PEM files",
                  file=sys.stderr)
            return 2
        try:
            paths = write_files(make_bundle(args.service, args.namespace, int(args.days)), args.out_dir)
        except OSError as exc:
            print(f"memslice extender-certs: cannot write the certificates in --out-dir {args.out_dir}: "
                  f"{exc.strerror or exc}; name a directory you can write (it is created if missing)",
                  file=sys.stderr)
            return 2
        print("memslice extender-certs: wrote " + ", ".join(paths))
        return 0
    from kubernetes import client

    from memslice.errors import ConfigError
    from memslice.scheduler_extender.cli import load_api_client

    try:
        core = client.CoreV1Api(load_api_client(args.kubeconfig))
        print("memslice extender-certs: " + ensure_secrets(core, args.namespace, args.service, args.server_secret,
                                                           args.client_secret, int(args.days)))
    except ConfigError as exc:  # no kubeconfig, or one that cannot be read: it names the file and the fix
        print(f"memslice extender-certs: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # noqa: BLE001 - report and exit
        print(f"memslice extender-certs: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0
