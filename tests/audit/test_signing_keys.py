"""Reading the operator's signing key (audit.signing.Signer): the PEM form Signer writes is read without
cryptography's key-file module, and gives the key that module reads; any other form is still read
by that module (or refused with a clear message)."""

from __future__ import annotations

import base64
import os
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed448 import Ed448PrivateKey
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from munkey_core.audit import signing
from munkey_core.errors import MunkeyError


def _key_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pem: bytes) -> Path:
    path = tmp_path / "keys" / "signing_key.pem"
    path.parent.mkdir(mode=0o700)
    path.write_bytes(pem)
    os.chmod(path, 0o600)
    monkeypatch.setenv(signing.SIGNING_KEY_ENV, str(path))
    return path


def _public_hex(key: Ed25519PrivateKey) -> str:
    return key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw).hex()


def test_a_key_signer_created_reads_as_the_key_file_module_reads_it(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(signing.CONFIG_ENV, str(tmp_path / "config"))
    monkeypatch.delenv(signing.SIGNING_KEY_ENV, raising=False)
    s = signing.Signer()  # created on first use, in the plain PKCS#8 form
    pem = s.path.read_bytes()
    assert signing._plain_ed25519_seed(pem) is not None
    reference = serialization.load_pem_private_key(pem, password=None)
    assert s.public_key == _public_hex(reference)
    assert pem == reference.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption())  # the bytes cryptography writes
    sig = s.sign(b"message")
    Ed25519PublicKey.from_public_bytes(bytes.fromhex(s.public_key)).verify(
        base64.b64decode(sig["value"]), b"message")
    assert signing.verify_signature(sig, b"message", s.public_key)[0]
    assert not signing.verify_signature(sig, b"other", s.public_key)[0]


def test_the_same_key_with_other_line_ends_reads_the_same(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    key = Ed25519PrivateKey.generate()
    pkcs8 = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption())
    wrapped = b"\n\n" + pkcs8.replace(b"\n", b"\r\n")  # other line ends and blank lines: the same key
    _key_file(tmp_path, monkeypatch, wrapped)
    assert signing._plain_ed25519_seed(wrapped) is not None
    assert signing.Signer(create=False).public_key == _public_hex(key)
    assert serialization.load_pem_private_key(wrapped, password=None).public_key().public_bytes_raw().hex() == \
        _public_hex(key)


def test_a_key_of_another_kind_or_a_damaged_key_is_refused_clearly(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Read by the key-file module as before: the same refusals."""
    ed448 = Ed448PrivateKey.generate().private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                     serialization.NoEncryption())
    _key_file(tmp_path, monkeypatch, ed448)
    with pytest.raises(MunkeyError, match="not an Ed25519 key"):
        signing.Signer(create=False)
    good = Ed25519PrivateKey.generate().private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                      serialization.NoEncryption())
    (tmp_path / "c").mkdir()
    _key_file(tmp_path / "c", monkeypatch, good.replace(b"MC4CAQAw", b"MC4CAQAx"))  # one DER byte changed
    with pytest.raises(MunkeyError, match="unreadable"):
        signing.Signer(create=False)
    openssh = Ed25519PrivateKey.generate().private_bytes(serialization.Encoding.PEM,
                                                         serialization.PrivateFormat.OpenSSH,
                                                         serialization.NoEncryption())
    (tmp_path / "d").mkdir()
    _key_file(tmp_path / "d", monkeypatch, openssh)
    with pytest.raises(MunkeyError, match="unreadable"):
        signing.Signer(create=False)
