"""Gateway settings: defaults < config file (TOML or JSON) < POLYHEAD_* environment < CLI flags."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr
from pydantic_settings import (
    BaseSettings,
    JsonConfigSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)


def default_cache_dir() -> Path:
    return Path.home() / ".cache" / "polyhead"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="POLYHEAD_", extra="forbid")

    # "tiny" builds the random-weight test model into the cache on first run; otherwise a directory.
    model: str = "tiny"
    cache_dir: Path = Field(default_factory=default_cache_dir)
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)

    admin_token: SecretStr | None = None  # None disables the admin API (403)
    admin_actor: str = "admin"  # recorded as who changed the policy

    # Initial policy document; the admin API replaces it at runtime.
    policy: dict[str, Any] = Field(default_factory=lambda: {"name": "lifecycle", "params": {}})
    device: str = "auto"  # a router.devices name, or "auto" to detect this CPU

    max_body_bytes: int = Field(default=1 << 20, gt=0)
    max_tokens_limit: int = Field(default=2048, gt=0)  # cap on a request's max_tokens
    default_max_tokens: int = Field(default=256, gt=0)
    max_stop_sequences: int = Field(default=4, ge=0)

    kv_cache_mb: int = Field(default=256, gt=0)
    block_size: int = Field(default=16, gt=0)
    max_num_seqs: int = Field(default=32, gt=0)
    max_num_batched_tokens: int = Field(default=2048, gt=0)
    torch_threads: int = Field(default=0, ge=0)  # 0 keeps torch's default

    shutdown_grace_s: int = Field(default=30, ge=0)  # time for in-flight streams to finish

    log_format: Literal["text", "json"] = "text"
    log_level: str = "INFO"


def load_settings(config_file: Path | None = None, **overrides: Any) -> Settings:
    """Build Settings; `overrides` are CLI flags and win over the environment and the file."""
    if config_file is None:
        return Settings(**overrides)
    if not config_file.is_file():
        raise FileNotFoundError(f"config file {config_file} does not exist")
    suffix = config_file.suffix.lower()
    if suffix not in (".toml", ".json"):
        raise ValueError(f"config file {config_file}: use .toml or .json")

    class FileSettings(Settings):
        @classmethod
        def settings_customise_sources(
            cls,
            settings_cls: type[BaseSettings],
            init_settings: PydanticBaseSettingsSource,
            env_settings: PydanticBaseSettingsSource,
            dotenv_settings: PydanticBaseSettingsSource,
            file_secret_settings: PydanticBaseSettingsSource,
        ) -> tuple[PydanticBaseSettingsSource, ...]:
            source: PydanticBaseSettingsSource = (
                TomlConfigSettingsSource(settings_cls, toml_file=config_file)
                if suffix == ".toml"
                else JsonConfigSettingsSource(settings_cls, json_file=config_file)
            )
            return (init_settings, env_settings, source)

    return FileSettings(**overrides)
