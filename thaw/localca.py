"""A local certificate authority for `thaw up --tls`: a CA kept in the state directory and
certificates made for each name asked (local development only).

The CA (ECDSA P-256, ten years) is made once as `<state>/tls/ca.pem` (+ `ca.key`; both
0600 in a 0700 dir) and reused, so a browser or curl told to trust it once keeps
trusting it. Placement's API gets `api.pem` + `api.key` there, for 127.0.0.1, ::1 and
`localhost`, made again at each start. Leaf
certificates (one day... rather a year, ECDSA P-256) are made in memory for `localhost`
(with `*.localhost` and 127.0.0.1) and for any name under the edge's domain a client
asks for by SNI — curl with OpenSSL refuses a bare `*.localhost` wildcard, so each app's
name (`hello.localhost`) gets its own.
"""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from ground.statefiles import private_dir, tighten, write_private

_PEM = serialization.Encoding.PEM


class LocalCA:
    def __init__(self, directory: Path, domain: str = "localhost") -> None:
        self.directory = directory
        self.domain = domain.lower().rstrip(".")
        self.cert_path = directory / "ca.pem"
        key_path = directory / "ca.key"
        private_dir(directory)
        if self.cert_path.exists() and key_path.exists():
            tighten(self.cert_path, key_path)
            self.key = serialization.load_pem_private_key(key_path.read_bytes(), None)
            self.cert = x509.load_pem_x509_certificate(self.cert_path.read_bytes())
        else:
            self.key = ec.generate_private_key(ec.SECP256R1())
            name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "thaw local CA")])
            now = datetime.datetime.now(datetime.UTC)
            self.cert = (
                x509.CertificateBuilder().subject_name(name).issuer_name(name)
                .public_key(self.key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(hours=1))
                .not_valid_after(now + datetime.timedelta(days=3650))
                .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
                .add_extension(x509.KeyUsage(
                    digital_signature=True, key_cert_sign=True, crl_sign=True,
                    content_commitment=False, key_encipherment=False, data_encipherment=False,
                    key_agreement=False, encipher_only=False, decipher_only=False),
                    critical=True)
                .sign(self.key, hashes.SHA256())
            )
            key_pem = self.key.private_bytes(_PEM, serialization.PrivateFormat.PKCS8,
                                             serialization.NoEncryption())
            write_private(key_path, key_pem)
            write_private(self.cert_path, self.cert.public_bytes(_PEM))

    def serves(self, name: str) -> bool:
        name = name.lower().rstrip(".")
        return name == self.domain or name.endswith("." + self.domain)

    def issue(self, name: str) -> tuple[bytes, bytes] | None:
        """(certificate chain PEM, key PEM) for `name`, or None for a name not under the
        domain (this CA answers for local names only)."""
        if not self.serves(name):
            return None
        name = name.lower().rstrip(".")
        names: list[x509.GeneralName] = [x509.DNSName(name)]
        if name == self.domain:
            names += [x509.DNSName("*." + name), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
        return self._leaf(name, names)

    def api_files(self) -> tuple[Path, Path]:
        """(certificate chain file, key file) for an API on this host: 127.0.0.1, ::1 and
        localhost, whatever the domain."""
        names: list[x509.GeneralName] = [
            x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
            x509.IPAddress(ipaddress.ip_address("::1"))]
        chain, key = self._leaf("thaw API", names)
        cert_path, key_path = self.directory / "api.pem", self.directory / "api.key"
        write_private(key_path, key)
        write_private(cert_path, chain)
        return cert_path, key_path

    def _leaf(self, name: str, names: list[x509.GeneralName]) -> tuple[bytes, bytes]:
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(self.cert.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=365))
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]),
                           critical=False)
            .sign(self.key, hashes.SHA256())  # type: ignore[arg-type]
        )
        key_pem = key.private_bytes(_PEM, serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption())
        return cert.public_bytes(_PEM) + self.cert.public_bytes(_PEM), key_pem
