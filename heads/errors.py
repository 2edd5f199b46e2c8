class HeadsError(Exception):
    """Base error of the heads package."""


class CheckpointError(HeadsError):
    """A model directory is missing, unreadable or inconsistent. The message names the field."""


class TokenizerError(HeadsError):
    """A tokenizer file cannot be loaded or does not match its head."""


class EngineError(HeadsError):
    """The local engine cannot accept or continue a request."""


class EngineOverloaded(EngineError):
    """The request can never fit the KV cache (prompt + max_tokens exceed its capacity)."""


class EngineStopped(EngineError):
    """The engine is shutting down and takes no new requests."""


class CorpusError(HeadsError):
    """A corpus source cannot be fetched, unpacked or read."""


class FetchError(HeadsError):
    """A named model cannot be downloaded, verified or converted (network, checksum, disk)."""


class EngineUnavailable(EngineError):
    """No healthy engine replica serves the request's head right now (retry later)."""


class EngineLost(EngineError):
    """The engine replica serving a stream stopped answering after tokens were sent."""


class AdaptError(HeadsError):
    """A head cannot be adapted as asked (unknown or native head, bad settings)."""


class GrammarError(HeadsError):
    """A structured-output spec (JSON schema, regex, grammar) cannot be compiled."""


class EngineUnsupported(EngineError):
    """The engine does not serve a feature the request asks for (a client error)."""


class MissingDependency(HeadsError):
    """A feature needs a package this install lacks. `install` says what brings it in."""

    def __init__(self, package: str, feature: str, install: str) -> None:
        super().__init__(f"{feature} needs the package {package}, which is not installed; "
                         f"{install}")
        self.package = package
        self.feature = feature
