"""The operator's secrets, kept outside every run directory: the Ed25519 signing key of receipts and
log heads, and the HMAC key of subject pseudonyms.

Where they live (first found wins):
- signing key: $MUNKEY_SIGNING_KEY (a path to a key file), else `<config>/signing_key.pem`;
- subject key: $MUNKEY_SUBJECT_KEY (64 hex digits, e.g. from a secret store), else
  `<config>/subject_key` (64 hex digits);
`<config>` being $MUNKEY_CONFIG_DIR, else $XDG_CONFIG_HOME/munkey, else ~/.config/munkey. A key
file that is missing is created on first use (directory 0700, file 0600); one that others may read,
or one inside a run directory, is refused. A run directory holds only *public* keys.

Why: whoever can write a run directory can rewrite an unkeyed hash chain end to end; a signature
needs the private key, which lives elsewhere. Whoever can read the run must not be able to undo a
subject pseudonym: the HMAC key is not in the run. Rotation: move the old file aside (keep it to
match or check old records; delete it to make old pseudonyms unlinkable) and the next use creates
a new key; every signature names its public key and every pseudonym its key id.
Verification needs only the public key (`verify_signature`). Tests: tests/test_hostile.py,
tests/audit/test_signing_keys.py (the key file read and written without cryptography's key-file module).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
import stat
from pathlib import Path

from munkey_core.errors import MunkeyError

SIGNING_KEY_ENV = "MUNKEY_SIGNING_KEY"
SUBJECT_KEY_ENV = "MUNKEY_SUBJECT_KEY"
CONFIG_ENV = "MUNKEY_CONFIG_DIR"
ALGORITHM = "ed25519"


def config_dir() -> Path:
    """Where the operator's key files live (never inside a run)."""
    env = os.environ.get(CONFIG_ENV)
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CONFIG_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".config") / "munkey"


def _ed25519():
    """(InvalidSignature, Ed25519PrivateKey, Ed25519PublicKey): signing and checking, without the
    key-file formats module (`serialization` and its SSH support: about half of the import)."""
    try:
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
    except ImportError:
        raise MunkeyError("Signed receipts need the 'cryptography' package: pip install cryptography.") from None
    return InvalidSignature, Ed25519PrivateKey, Ed25519PublicKey


def _crypto():
    InvalidSignature, Ed25519PrivateKey, Ed25519PublicKey = _ed25519()
    from cryptography.hazmat.primitives import serialization

    return InvalidSignature, serialization, Ed25519PrivateKey, Ed25519PublicKey


# The PKCS#8 DER of an Ed25519 private key without attributes (RFC 8410), as Signer writes it: this
# prefix, then the 32-byte seed. Such a file is written and read without the `serialization` module.
_PKCS8_ED25519 = bytes.fromhex("302e020100300506032b657004220420")
_PEM_HEAD, _PEM_TAIL = b"-----BEGIN PRIVATE KEY-----", b"-----END PRIVATE KEY-----"


def _plain_ed25519_pem(seed: bytes) -> bytes:
    """The unencrypted PKCS#8 PEM of an Ed25519 key (what cryptography's PEM + PKCS8 encoding writes)."""
    return _PEM_HEAD + b"\n" + base64.b64encode(_PKCS8_ED25519 + seed) + b"\n" + _PEM_TAIL + b"\n"


def _plain_ed25519_seed(pem: bytes) -> bytes | None:
    """The seed of an unencrypted PKCS#8 PEM Ed25519 key in its plain form, else None (read in full)."""
    text = pem.strip()
    if not (text.startswith(_PEM_HEAD) and text.endswith(_PEM_TAIL)):
        return None
    try:
        der = base64.b64decode(b"".join(text[len(_PEM_HEAD):-len(_PEM_TAIL)].split()), validate=True)
    except ValueError:
        return None
    if len(der) != len(_PKCS8_ED25519) + 32 or not der.startswith(_PKCS8_ED25519):
        return None
    return der[len(_PKCS8_ED25519):]


def _check_private_file(path: Path) -> None:
    st_ = path.stat()
    if st_.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise MunkeyError(f"The key file {path} may be read by other users (mode {stat.S_IMODE(st_.st_mode):o}); "
                          f"make it private with 'chmod 600 {path}' and retry. Nothing was changed.")


def _create_private_file(path: Path, data: bytes) -> None:
    """Write a new secret file 0600 in a 0700 directory; never replaces an existing one."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return  # another process created it first: use theirs
    except OSError as exc:
        raise MunkeyError(f"Cannot create the key file {path} ({exc.strerror or exc}); set {CONFIG_ENV} to a "
                          "private folder you can write (outside every run). Nothing was changed.") from None
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def refuse_inside(key_path: Path, run_root: Path | None) -> None:
    """A key file inside the run it protects protects nothing."""
    if run_root is None:
        return
    try:
        inside = key_path.resolve().is_relative_to(Path(run_root).resolve())
    except OSError:
        return
    if inside:
        raise MunkeyError(f"The key file {key_path} lies inside the run directory {run_root}; keep keys outside "
                          f"every run ({CONFIG_ENV} or {SIGNING_KEY_ENV}). Nothing was changed.")


# --------------------------------------------------------------------------- signing key


def signing_key_path() -> Path:
    env = os.environ.get(SIGNING_KEY_ENV)
    return Path(env).expanduser() if env else config_dir() / "signing_key.pem"


class Signer:
    """The operator's Ed25519 private key (loaded, or created on first use)."""

    def __init__(self, run_root: Path | None = None, create: bool = True) -> None:
        _, Ed25519PrivateKey, _ = _ed25519()
        path = signing_key_path()
        refuse_inside(path, run_root)
        if not path.exists():
            if not create or os.environ.get(SIGNING_KEY_ENV):
                raise MunkeyError(f"The signing key {path} does not exist. Create one (it is created on first use "
                                  f"when {SIGNING_KEY_ENV} is unset) or point {SIGNING_KEY_ENV} at it.")
            _create_private_file(path, _plain_ed25519_pem(Ed25519PrivateKey.generate().private_bytes_raw()))
        _check_private_file(path)
        try:
            pem = path.read_bytes()
            seed = _plain_ed25519_seed(pem)
            if seed is not None:  # the form this class writes: no need for the key-file formats module
                key = Ed25519PrivateKey.from_private_bytes(seed)
            else:
                key = _crypto()[1].load_pem_private_key(pem, password=None)
        except (ValueError, TypeError, OSError) as exc:
            raise MunkeyError(f"The signing key {path} is unreadable ({type(exc).__name__}); restore it or point "
                              f"{SIGNING_KEY_ENV} at a PEM Ed25519 key.") from None
        if not isinstance(key, Ed25519PrivateKey):
            raise MunkeyError(f"The signing key {path} is not an Ed25519 key.")
        self._key = key
        self.path = path
        self.public_key = key.public_key().public_bytes_raw().hex()

    def sign(self, message: bytes) -> dict:
        """{algorithm, public_key (hex), value (base64)} of an Ed25519 signature over `message`."""
        return {"algorithm": ALGORITHM, "public_key": self.public_key,
                "value": base64.b64encode(self._key.sign(message)).decode("ascii")}


_CACHE: dict[tuple, Signer] = {}


def signer(run_root: Path | None = None) -> Signer:
    """This machine's signer (loaded once per key file version; created on first use)."""
    path = signing_key_path()
    refuse_inside(path, run_root)
    try:
        st_ = path.stat()
        stamp = (str(path), st_.st_mtime_ns, st_.st_size, st_.st_mode)
    except OSError:
        return Signer(run_root)
    if stamp not in _CACHE:
        _CACHE.clear()
        _CACHE[stamp] = Signer(run_root)
    return _CACHE[stamp]


def local_public_key() -> str | None:
    """The public key of this machine's signing key, or None when there is none (nothing is created)."""
    path = signing_key_path()
    if not path.exists():
        return None
    try:
        return Signer(create=False).public_key
    except MunkeyError:
        return None


def parse_public_key(text: str) -> str:
    """A public key given by a user: 64 hex digits, or a file holding them (or a PEM public key)."""
    text = str(text).strip()
    p = Path(text)
    if len(text) < 4096 and p.is_file():
        data = p.read_bytes()[:10_000]
        if b"BEGIN PUBLIC KEY" in data:
            _, serialization, _, Ed25519PublicKey = _crypto()
            try:
                key = serialization.load_pem_public_key(data)
            except ValueError:
                raise MunkeyError(f"{p} is not a readable public key.") from None
            if not isinstance(key, Ed25519PublicKey):
                raise MunkeyError(f"{p} is not an Ed25519 public key.")
            return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw).hex()
        text = data.decode("ascii", errors="replace").strip()
    text = text.removeprefix("ed25519:").lower()
    if len(text) != 64 or any(c not in "0123456789abcdef" for c in text):
        raise MunkeyError("A public key is 64 hexadecimal digits (as printed by 'munkey audit key'), or a file "
                          "holding them.")
    return text


def verify_signature(signature: object, message: bytes, public_key: str | None = None) -> tuple[bool, str]:
    """(ok, why) for a signature dict made by `Signer.sign`; `public_key` (hex), when given, must be
    the key that signed. Never raises on malformed input."""
    InvalidSignature, _, Ed25519PublicKey = _ed25519()
    if not isinstance(signature, dict) or signature.get("algorithm") != ALGORITHM:
        return False, "the signature is missing or not an Ed25519 signature"
    pub, value = signature.get("public_key"), signature.get("value")
    if not isinstance(pub, str) or not isinstance(value, str) or len(value) > 200:
        return False, "the signature is malformed"
    if public_key is not None and pub.lower() != public_key.lower():
        return False, f"signed by key {pub[:16]}..., not by the trusted key {public_key[:16]}..."
    try:
        key = Ed25519PublicKey.from_public_bytes(bytes.fromhex(pub))
        key.verify(base64.b64decode(value, validate=True), message)
    except (ValueError, TypeError):
        return False, "the signature is malformed"
    except InvalidSignature:
        return False, "the signature does not match the signed content"
    return True, f"signed by key {pub[:16]}..."


# --------------------------------------------------------------------------- subject pseudonyms


def subject_key_path() -> Path:
    return config_dir() / "subject_key"


def subject_key(run_root: Path | None = None) -> bytes:
    """The HMAC key of subject pseudonyms: $MUNKEY_SUBJECT_KEY, else the key file (created 0600)."""
    env = os.environ.get(SUBJECT_KEY_ENV)
    if env:
        text = env.strip()
    else:
        path = subject_key_path()
        refuse_inside(path, run_root)
        if not path.exists():
            _create_private_file(path, (secrets.token_hex(32) + "\n").encode("ascii"))
        _check_private_file(path)
        text = path.read_text(encoding="ascii", errors="replace").strip()
    try:
        key = bytes.fromhex(text)
    except ValueError:
        key = b""
    if len(key) < 16:
        raise MunkeyError(f"The subject key ({SUBJECT_KEY_ENV} or {subject_key_path()}) must be at least 32 "
                          "hexadecimal digits.")
    return key


def subject_ref(subject: str | None, run_root: Path | None = None) -> str | None:
    """A pseudonymous reference: HMAC-SHA256 under a key kept outside the run, with the key's id so a
    rotation is visible (`hmac-sha256:<key id>:<digest>`)."""
    if subject is None or not str(subject).strip():
        return None
    key = subject_key(run_root)
    kid = hashlib.sha256(b"munkey-subject-key-id" + key).hexdigest()[:8]
    return f"hmac-sha256:{kid}:" + hmac.new(key, str(subject).strip().encode("utf-8"), hashlib.sha256).hexdigest()[:32]
