#!/usr/bin/env python3
"""A minimal OIDC issuer on 127.0.0.1 for scripts/measure-config-costs.sh.

Generates a CA, a server certificate for 127.0.0.1 and an EC P-256 signing key; serves
/.well-known/openid-configuration and the JWKS over HTTPS; writes into DIR the CA
(issuer-ca.pem), one ES256 JWT (token.jwt: iss, aud, sub, groups, iat, nbf, exp in 24 h) and
the issuer URL (issuer-url); prints "listening on 127.0.0.1:PORT" once ready and serves until
killed.

usage: measure_issuer.py DIR AUDIENCE SUBJECT GROUP
"""

import base64
import datetime
import http.server
import ipaddress
import json
import os
import ssl
import sys
import time

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature
from cryptography.x509.oid import NameOID


def b64url(b):
    return base64.urlsafe_b64encode(b).rstrip(b"=").decode()


def cert(subject_cn, public_key, issuer_name, signing_key, ca, now):
    b = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject_cn)]))
        .issuer_name(issuer_name)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if ca:
        b = b.add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), True
        )
    else:
        b = b.add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
    return b.sign(signing_key, hashes.SHA256())


def main():
    out, audience, subject, group = sys.argv[1:5]
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "measure issuer CA")])
    ca_cert = cert("measure issuer CA", ca_key.public_key(), ca_name, ca_key, True, now)
    srv_key = ec.generate_private_key(ec.SECP256R1())
    srv_cert = cert("127.0.0.1", srv_key.public_key(), ca_name, ca_key, False, now)
    sign_key = ec.generate_private_key(ec.SECP256R1())

    pem = serialization.Encoding.PEM
    with open(os.path.join(out, "issuer-ca.pem"), "wb") as f:
        f.write(ca_cert.public_bytes(pem))
    with open(os.path.join(out, "issuer-server.pem"), "wb") as f:
        f.write(srv_cert.public_bytes(pem))
    with open(os.path.join(out, "issuer-server.key"), "wb") as f:
        f.write(
            srv_key.private_bytes(
                pem,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), None)
    port = httpd.server_address[1]
    url = f"https://127.0.0.1:{port}"
    nums = sign_key.public_key().public_numbers()
    jwk = {
        "kty": "EC",
        "crv": "P-256",
        "alg": "ES256",
        "use": "sig",
        "kid": "measure-1",
        "x": b64url(nums.x.to_bytes(32, "big")),
        "y": b64url(nums.y.to_bytes(32, "big")),
    }
    discovery = json.dumps(
        {
            "issuer": url,
            "jwks_uri": url + "/keys",
            "id_token_signing_alg_values_supported": ["ES256"],
        }
    ).encode()
    jwks = json.dumps({"keys": [jwk]}).encode()

    t = int(time.time())
    header = b64url(json.dumps({"alg": "ES256", "typ": "JWT", "kid": "measure-1"}).encode())
    claims = b64url(
        json.dumps(
            {
                "iss": url,
                "aud": audience,
                "sub": subject,
                "groups": [group],
                "iat": t,
                "nbf": t,
                "exp": t + 86400,
            }
        ).encode()
    )
    der = sign_key.sign(f"{header}.{claims}".encode(), ec.ECDSA(hashes.SHA256()))
    r, s = decode_dss_signature(der)
    sig = b64url(r.to_bytes(32, "big") + s.to_bytes(32, "big"))
    with open(os.path.join(out, "token.jwt"), "w") as f:
        f.write(f"{header}.{claims}.{sig}")
    with open(os.path.join(out, "issuer-url"), "w") as f:
        f.write(url)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = {
                "/.well-known/openid-configuration": discovery,
                "/keys": jwks,
            }.get(self.path)
            if body is None:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    httpd.RequestHandlerClass = Handler
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(
        os.path.join(out, "issuer-server.pem"), os.path.join(out, "issuer-server.key")
    )
    httpd.socket = ctx.wrap_socket(httpd.socket, server_side=True)
    print(f"listening on 127.0.0.1:{port}", flush=True)
    httpd.serve_forever()


if __name__ == "__main__":
    main()
