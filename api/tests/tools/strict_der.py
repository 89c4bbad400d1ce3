"""Parses each PEM certificate named on the command line with pyca/cryptography, a strict DER
parser (it refuses, among others, an encoded DEFAULT value such as an explicit `cA FALSE`).
Prints one line per refused certificate and exits 1 when any was refused."""

import sys

from cryptography import x509

refused = 0
for path in sys.argv[1:]:
    try:
        with open(path, "rb") as f:
            cert = x509.load_pem_x509_certificate(f.read())
        # Extensions are parsed lazily: touch every one.
        for ext in cert.extensions:
            _ = ext.value
        _ = cert.subject, cert.issuer, cert.public_key(), cert.signature_algorithm_oid
    except Exception as e:  # noqa: BLE001 - every refusal is reported with its path
        refused += 1
        print(f"{path}: {type(e).__name__}: {e}")
sys.exit(1 if refused else 0)
