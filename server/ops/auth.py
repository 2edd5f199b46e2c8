"""Named secrets (admin tokens, client API keys) and their constant-time lookup.

Secrets come from settings (`admin_token`, `admin_tokens`, `api_keys`) or a JSON file of
`{"name": "secret"}`. Only names ever reach logs, metrics and the audit trail.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Mapping
from pathlib import Path

from pydantic import SecretStr

from server.settings import Settings


class KeyRing:
    def __init__(self, keys: Mapping[str, str]) -> None:
        if any(not secret for secret in keys.values()):
            raise ValueError("empty secrets are not allowed")
        self._keys = [(name, secret.encode()) for name, secret in keys.items()]

    def __bool__(self) -> bool:
        return bool(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    def match(self, presented: str) -> str | None:
        """The name of the key equal to `presented`, else None.

        Every key is compared, each with compare_digest, so timing reveals neither which
        key nor how much of it matched.
        """
        token = presented.encode()
        found = None
        for name, secret in self._keys:
            if hmac.compare_digest(token, secret) and found is None:
                found = name
        return found


def _read_file(path: Path | None) -> dict[str, str]:
    if path is None:
        return {}
    data = json.loads(path.read_text())
    if not isinstance(data, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in data.items()
    ):
        raise ValueError(f"{path}: expected a JSON object of name -> secret strings")
    return data


def _plain(secrets: Mapping[str, SecretStr]) -> dict[str, str]:
    return {name: s.get_secret_value() for name, s in secrets.items()}


def admin_keyring(s: Settings) -> KeyRing:
    keys = {**_plain(s.admin_tokens), **_read_file(s.admin_tokens_file)}
    if s.admin_token is not None:
        keys[s.admin_actor] = s.admin_token.get_secret_value()
    return KeyRing(keys)


def client_keyring(s: Settings) -> KeyRing:
    return KeyRing({**_plain(s.api_keys), **_read_file(s.api_keys_file)})


def bearer(authorization: str) -> str | None:
    scheme, _, token = authorization.partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None
