#!/usr/bin/env python3
"""Writes the generated seeds into seeds/TARGET: requests and CSRs as ACME
clients send them, signed with fresh keys of each type (python3-cryptography),
identifier values worth starting from, the configuration examples of the
repository's docs, and notification templates. Run again to refresh them."""
import base64
import glob
import ipaddress
import json
import os
import re

from cryptography import x509
from cryptography.hazmat.primitives import hashes, hmac, serialization
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, padding, rsa, utils

HERE = os.path.dirname(os.path.abspath(__file__))
URL = "https://acme.example/profile/default/new-order"


def b64(b):
    return base64.urlsafe_b64encode(b).rstrip(b"=").decode()


def ec_jwk(key, crv, size):
    n = key.public_key().public_numbers()
    return {"kty": "EC", "crv": crv, "x": b64(n.x.to_bytes(size, "big")),
            "y": b64(n.y.to_bytes(size, "big"))}


def rsa_jwk(key):
    n = key.public_key().public_numbers()
    def octets(v):
        return v.to_bytes((v.bit_length() + 7) // 8, "big")
    return {"kty": "RSA", "n": b64(octets(n.n)), "e": b64(octets(n.e))}


def sign_ec(key, hash_, size, protected, payload):
    p = b64(json.dumps(protected).encode())
    pl = b64(json.dumps(payload).encode()) if payload is not None else ""
    r, s = utils.decode_dss_signature(key.sign(f"{p}.{pl}".encode(), ec.ECDSA(hash_)))
    return {"protected": p, "payload": pl,
            "signature": b64(r.to_bytes(size, "big") + s.to_bytes(size, "big"))}


def main():
    p256 = ec.generate_private_key(ec.SECP256R1())
    p384 = ec.generate_private_key(ec.SECP384R1())
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ed = ed25519.Ed25519PrivateKey.generate()
    jwk256, jwk384, jwk_rsa = ec_jwk(p256, "P-256", 32), ec_jwk(p384, "P-384", 48), rsa_jwk(rsa_key)
    seeds = {}
    seeds["jws/new-account-es256.json"] = sign_ec(
        p256, hashes.SHA256(), 32, {"alg": "ES256", "jwk": jwk256, "nonce": "n0nce", "url": URL},
        {"termsOfServiceAgreed": True, "contact": ["mailto:a@example.org"]})
    seeds["jws/kid-es384.json"] = sign_ec(
        p384, hashes.SHA384(), 48,
        {"alg": "ES384", "kid": "https://acme.example/profile/default/acct/abc", "nonce": "n", "url": URL},
        {"identifiers": [{"type": "dns", "value": "a.example.org"}]})
    seeds["jws/post-as-get.json"] = sign_ec(
        p256, hashes.SHA256(), 32,
        {"alg": "ES256", "kid": "https://acme.example/acct/1", "nonce": "n", "url": URL}, None)
    p = b64(json.dumps({"alg": "RS256", "jwk": jwk_rsa, "nonce": "n", "url": URL}).encode())
    pl = b64(b"{}")
    seeds["jws/rs256.json"] = {"protected": p, "payload": pl, "signature": b64(
        rsa_key.sign(f"{p}.{pl}".encode(), padding.PKCS1v15(), hashes.SHA256()))}
    inner = sign_ec(p384, hashes.SHA384(), 48, {"alg": "ES384", "jwk": jwk384, "url": URL},
                    {"account": "https://acme.example/acct/1", "oldKey": jwk256})
    seeds["jws/key-change.json"] = sign_ec(
        p256, hashes.SHA256(), 32,
        {"alg": "ES256", "kid": "https://acme.example/acct/1", "nonce": "n", "url": URL}, inner)
    seeds["jwk/p256.json"] = jwk256
    seeds["jwk/p384.json"] = jwk384
    seeds["jwk/rsa.json"] = jwk_rsa
    seeds["jwk/ed25519.json"] = {"kty": "OKP", "crv": "Ed25519", "x": b64(ed.public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw))}
    mac_p = b64(json.dumps({"alg": "HS256", "kid": "kid-1", "url": URL}).encode())
    mac_pl = b64(json.dumps(jwk256).encode())
    mac = hmac.HMAC(b"an hmac key", hashes.SHA256())
    mac.update(f"{mac_p}.{mac_pl}".encode())
    seeds["payloads/new-account-eab.json"] = {
        "termsOfServiceAgreed": True, "contact": ["mailto:a@example.org"],
        "externalAccountBinding": {"protected": mac_p, "payload": mac_pl, "signature": b64(mac.finalize())}}
    seeds["payloads/new-order.json"] = {
        "identifiers": [{"type": "dns", "value": "*.example.org"}, {"type": "ip", "value": "192.0.2.1"}],
        "notBefore": "2026-01-01T00:00:00Z", "replaces": "aYhba4dGQEHhs3uEe6CuLN4ByNQ.AIdlQyE",
        "profile": "tlsserver"}
    seeds["payloads/finalize.json"] = {"csr": "MIIBADCBqAIBADAAMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE"}
    seeds["payloads/revocation.json"] = {"certificate": "MIIB", "reason": 4}
    seeds["payloads/account-update.json"] = {"status": "deactivated", "contact": []}
    for path, value in seeds.items():
        os.makedirs(os.path.join(HERE, "seeds", os.path.dirname(path)), exist_ok=True)
        with open(os.path.join(HERE, "seeds", path), "w") as f:
            f.write(json.dumps(value))
    names = ["host.example.org", "*.example.org", "xn--bcher-kva.example", "bücher.example",
             "a..b", "-a.example", "a" * 64 + ".example", "*.example.org\n*.example.org",
             "aYhba4dGQEHhs3uEe6CuLN4ByNQ.AIdlQyE", "192.0.2.1", "EXAMPLE.ORG."]
    os.makedirs(os.path.join(HERE, "seeds", "names"), exist_ok=True)
    for i, name in enumerate(names):
        with open(os.path.join(HERE, "seeds", "names", f"{i:02}"), "w") as f:
            f.write(name)
    csrs(p256, p384, rsa_key, ed)
    configs()
    templates()


def write(target, name, data):
    os.makedirs(os.path.join(HERE, "seeds", target), exist_ok=True)
    with open(os.path.join(HERE, "seeds", target, name), "wb") as f:
        f.write(data)


def csrs(p256, p384, rsa_key, ed):
    """CSRs for the names the csr target's order has, as certbot (SANs
    only), lego (CN and SANs) and cert-manager (with key and extended key
    usages) write them, one per key type; the Ed25519 one is refused."""
    sans = x509.SubjectAlternativeName([
        x509.DNSName("example.com"), x509.DNSName("www.example.com"),
        x509.IPAddress(ipaddress.ip_address("192.0.2.1"))])
    cn = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "example.com")])
    for name, key, hash_ in [("p256", p256, hashes.SHA256()), ("p384", p384, hashes.SHA384()),
                             ("rsa", rsa_key, hashes.SHA256()), ("ed25519", ed, None)]:
        certbot = x509.CertificateSigningRequestBuilder().subject_name(x509.Name([]))
        certbot = certbot.add_extension(sans, critical=False)
        write("csr", f"certbot-{name}.der", certbot.sign(key, hash_).public_bytes(serialization.Encoding.DER))
        lego = x509.CertificateSigningRequestBuilder().subject_name(cn).add_extension(sans, critical=False)
        write("csr", f"lego-{name}.der", lego.sign(key, hash_).public_bytes(serialization.Encoding.DER))
    manager = (x509.CertificateSigningRequestBuilder().subject_name(cn)
               .add_extension(sans, critical=False)
               .add_extension(x509.KeyUsage(True, False, True, False, False, False, False, False, False),
                              critical=True)
               .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                     ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False))
    write("csr", "cert-manager-p256.der",
          manager.sign(p256, hashes.SHA256()).public_bytes(serialization.Encoding.DER))


def configs():
    """The example configuration, and every TOML block of the docs."""
    root = os.path.dirname(HERE)
    with open(os.path.join(root, "acme-proxy.example.toml"), "rb") as f:
        write("config", "example.toml", f.read())
    # The dictionary: every key of the reference (its last part, as a TOML
    # key is written inside its table) and every [table] header.
    with open(os.path.join(root, "docs", "configuration-reference.md")) as f:
        reference = f.read()
    words = set()
    for key in re.findall(r"^### `([^`]+)`", reference, re.M):
        words.add(key.split(".")[-1] + " = ")
    for table in re.findall(r"^## `(\[[^`]+\])`", reference, re.M):
        words.add(table)
    words.update(["[profiles.default]", "[profiles.default.signer]", 'type = "relay"',
                  'type = "custom"', 'type = "local_ca"', "= true", "= false", "= []",
                  '= "30s"', '"""', "'''"])
    with open(os.path.join(HERE, "dict", "config.dict"), "w") as f:
        f.write("# Keys and tables of docs/configuration-reference.md (make-seeds.py).\n")
        for word in sorted(words):
            f.write(json.dumps(word) + "\n")
    for path in sorted(glob.glob(os.path.join(root, "docs", "**", "*.md"), recursive=True)):
        with open(path) as f:
            blocks = re.findall(r"```toml\n(.*?)```", f.read(), re.S)
        stem = os.path.relpath(path, os.path.join(root, "docs")).replace("/", "-")[:-3]
        for i, block in enumerate(blocks):
            write("config", f"{stem}-{i:02}.toml", block.encode())


def templates():
    """Templates as operators write them (the docs' Teams and Matrix ones)
    and the built-ins' constructs."""
    samples = {
        "teams.json": '{"@type": "MessageCard", "summary": {{ notice.event | tojson }}, "text": {{ (notice.event ~ " (" ~ notice.profile ~ "): " ~ (notice.identifiers | join(", ")) ~ (" \u2014 " ~ notice.detail if notice.detail else "")) | tojson }}}',
        "matrix.json": '{"msgtype": "m.text", "body": {{ (notice.event ~ " " ~ (notice.identifiers | join(", "))) | tojson }}}',
        "default.json": "{{ notice | tojson }}",
        "subject.txt": '[acme-proxy] {{ notice.event }} ({{ notice.profile }}){% if notice.identifiers %}: {{ notice.identifiers | join(", ") }}{% endif %}',
        "body.txt": "Event: {{ notice.event }}\n{% if notice.serial %}Serial: {{ notice.serial }}\n{% endif %}{% for id in notice.identifiers %}- {{ id | upper }}\n{% endfor %}{% set n = notice.identifiers | length %}{{ n * 2 }} {{ range(3) | list }} {% macro m(x) %}{{ x }}{% endmacro %}{{ m(notice.at) }}",
    }
    for name, text in samples.items():
        write("templates", name, text.encode())


if __name__ == "__main__":
    main()
