import json

import pytest
from pydantic import ValidationError

from server.settings import load_settings


def test_precedence_flag_over_env_over_file(tmp_path, monkeypatch):
    cfg = tmp_path / "polyhead.toml"
    cfg.write_text('port = 9001\nhost = "0.0.0.0"\nmax_num_seqs = 7\n')
    monkeypatch.setenv("POLYHEAD_HOST", "127.0.0.2")
    s = load_settings(cfg, port=9002)
    assert (s.port, s.host, s.max_num_seqs) == (9002, "127.0.0.2", 7)


def test_json_config_and_policy_document(tmp_path):
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"policy": {"name": "pinned", "params": {"head": "1k"}}}))
    assert load_settings(cfg).policy["params"] == {"head": "1k"}


def test_unknown_key_and_bad_value_are_rejected(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text("prot = 1\n")
    with pytest.raises(ValidationError):
        load_settings(cfg)
    with pytest.raises(ValidationError):
        load_settings(None, port=70000)
    with pytest.raises(FileNotFoundError):
        load_settings(tmp_path / "missing.toml")


def test_admin_token_is_secret(monkeypatch):
    monkeypatch.setenv("POLYHEAD_ADMIN_TOKEN", "s3cret")
    s = load_settings(None)
    assert "s3cret" not in repr(s)
    assert s.admin_token is not None and s.admin_token.get_secret_value() == "s3cret"
