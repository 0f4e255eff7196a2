"""A throwaway certificate authority and a server certificate for 127.0.0.1 (openssl),
for servers a test starts with TLS."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Certs:
    ca: Path
    cert: Path
    key: Path


def make_certs(directory: Path) -> Certs:
    """A CA and a server certificate it signed for IP 127.0.0.1, valid for two days."""
    d = Path(directory)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=30)

    run("req", "-x509", *ec, "-keyout", str(d / "ca.key"), "-out", str(d / "ca.crt"),
        "-days", "2", "-subj", "/CN=compaction-proxy test CA")  # fmt: skip
    run("req", *ec, "-keyout", str(d / "server.key"), "-out", str(d / "server.csr"),
        "-subj", "/CN=127.0.0.1")  # fmt: skip
    (d / "san.cnf").write_text("subjectAltName=IP:127.0.0.1\n")
    run("x509", "-req", "-in", str(d / "server.csr"), "-CA", str(d / "ca.crt"),
        "-CAkey", str(d / "ca.key"), "-CAcreateserial", "-out", str(d / "server.crt"),
        "-days", "2", "-extfile", str(d / "san.cnf"))  # fmt: skip
    return Certs(ca=d / "ca.crt", cert=d / "server.crt", key=d / "server.key")
