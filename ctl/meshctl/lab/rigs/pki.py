# SPDX-License-Identifier: Apache-2.0
"""A throwaway PKI for etcd with client-cert auth, made with the openssl CLI at run time.

The lab and the tests need a CA, a server certificate whose SANs cover the addresses etcd listens
on, and client certificates for the agents. Nothing here is meant for production keys: it exists
so every test exercises the same mTLS path a real deployment uses.
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from meshctl.node.shell import sh


@dataclass(frozen=True)
class CertFiles:
    """Paths of one identity: certificate, key (mode 0600) and the CA that signed it."""

    cert: Path
    key: Path
    ca: Path


def make_ca(directory: str | Path, name: str = "meshctl-ca", days: int = 30) -> CertFiles:
    """A self-signed EC CA in `directory` (ca.pem, ca-key.pem); reused if it is already there."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    cert, key = d / "ca.pem", d / "ca-key.pem"
    if not (cert.exists() and key.exists()):
        _genkey(key)
        sh(["openssl", "req", "-x509", "-new", "-key", str(key), "-out", str(cert), "-days", str(days),
            "-subj", f"/CN={name}", "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign"])
    return CertFiles(cert, key, cert)


def make_cert(ca: CertFiles, directory: str | Path, name: str, *, server: bool = False,
              hosts: tuple[str, ...] = (), days: int = 30, common_name: bool = True,
              subject: str | None = None) -> CertFiles:
    """A certificate `name.pem` + `name-key.pem` signed by `ca`. Server certificates carry `hosts`
    (IPs or DNS names) as SANs and are usable as clients too (etcd peers need both).

    `common_name=False` names the holder in OU instead of CN: etcd's JSON gateway refuses client
    certificates with a CN once auth is on (it cannot pass the CN on as the user, etcd PR 10392),
    so clients of the gateway prove who they are with a user and password over TLS instead."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    cert, key, csr, ext = d / f"{name}.pem", d / f"{name}-key.pem", d / f"{name}.csr", d / f"{name}.ext"
    _genkey(key)
    subject = subject or (f"/CN={name}" if common_name else f"/O=meshctl/OU={name}")
    sh(["openssl", "req", "-new", "-key", str(key), "-out", str(csr), "-subj", subject])
    lines = ["basicConstraints=CA:FALSE", "keyUsage=critical,digitalSignature,keyEncipherment"]
    lines.append("extendedKeyUsage=serverAuth,clientAuth" if server else "extendedKeyUsage=clientAuth")
    if hosts:
        sans = [f"IP:{h}" if _is_ip(h) else f"DNS:{h}" for h in hosts]
        lines.append("subjectAltName=" + ",".join(sans))
    ext.write_text("\n".join(lines) + "\n")
    sh(["openssl", "x509", "-req", "-in", str(csr), "-CA", str(ca.cert), "-CAkey", str(ca.key),
        "-CAcreateserial", "-out", str(cert), "-days", str(days), "-extfile", str(ext)])
    csr.unlink(missing_ok=True)
    ext.unlink(missing_ok=True)
    return CertFiles(cert, key, ca.cert)


def make_keypair(directory: str | Path, name: str) -> tuple[Path, Path]:
    """An EC key pair `name.key` (0600) and `name.pub` (PEM public key), for signing tokens."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    key, pub = d / f"{name}.key", d / f"{name}.pub"
    if not (key.exists() and pub.exists()):
        _genkey(key)
        sh(["openssl", "pkey", "-in", str(key), "-pubout", "-out", str(pub)])
    return key, pub


def _genkey(path: Path) -> None:
    # Create the file 0600 before openssl writes into it, so the key is never world-readable.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.close(fd)
    os.chmod(path, 0o600)
    sh(["openssl", "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", str(path)])
    os.chmod(path, 0o600)


def _is_ip(h: str) -> bool:
    try:
        ipaddress.ip_address(h)
    except ValueError:
        return False
    return True
