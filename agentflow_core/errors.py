"""Typed errors. Each names where the problem is (file, key path, env_id/step_id) and what was expected."""

from __future__ import annotations

from typing import Any


class AgentFlowError(Exception):
    """Base of every error the library raises on purpose."""


MAX_SHOWN = 200


def shown(value: Any, limit: int = MAX_SHOWN) -> str:
    """``repr(value)`` cut to ``limit`` characters: a hostile value must not become a 39 MB message."""
    try:
        text = repr(value)
    except (ValueError, RecursionError):  # e.g. an int beyond sys.get_int_max_str_digits()
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


class ConfigError(AgentFlowError):
    """A configuration value is missing, malformed or out of range."""

    def __init__(self, file: str, key: str, value: Any, expected: str) -> None:
        self.file, self.key, self.value, self.expected = file, key, value, expected
        super().__init__(f"{file}: {key}: got {shown(value)}, expected {expected}")


class MappingError(AgentFlowError):
    """A semantic mapping file failed its JSON Schema or a semantic check."""

    def __init__(self, file: str, json_path: str, message: str) -> None:
        self.file, self.json_path = file, json_path
        super().__init__(f"{file}: at {json_path}: {message}")


class RegistryError(AgentFlowError):
    """An env config in the registry is unusable (bad class path, duplicate env_id, ...)."""

    def __init__(self, file: str, message: str) -> None:
        self.file = file
        super().__init__(f"{file}: {message}")


class EnvError(AgentFlowError):
    """An environment misbehaved; carries env_id and step_id so the episode can be isolated."""

    failure_reason = "env_error"

    def __init__(self, env_id: str, step_id: int, message: str) -> None:
        self.env_id, self.step_id = env_id, step_id
        super().__init__(f"env {env_id} step {step_id}: {self.failure_reason}: {message}")


class EnvCrashError(EnvError):
    """The environment raised."""

    failure_reason = "env_crash"


class EnvInvalidError(EnvError):
    """The environment returned NaN/inf or a value outside its declared space."""

    failure_reason = "env_invalid"


class NonFiniteError(AgentFlowError):
    """The learner met NaN or inf; it stops rather than train on (or checkpoint) garbage."""

    def __init__(self, update: int, quantity: str, detail: str, *, stage: str = "update") -> None:
        self.update, self.quantity, self.stage = update, quantity, stage
        super().__init__(f"{stage} {update}: non-finite {quantity} ({detail}); training stopped, nothing checkpointed")


class DataFileError(AgentFlowError, ValueError):
    """A dataset file (catalogue, trajectory shard, card) is damaged or unreadable."""

    def __init__(self, file: object, reason: str) -> None:
        self.file = str(file)
        super().__init__(f"{file}: damaged or unreadable: {reason[:300]}")


# What readers of JSON/parquet raise on damaged bytes (pyarrow's errors subclass these too).
DATA_ERRORS = (OSError, ValueError, KeyError, TypeError, RecursionError)


class RequirementError(AgentFlowError):
    """Something the configured cycle needs outside Python is missing: a binary, a service, a port, a folder.

    ``problems`` holds one line per missing requirement, each saying what to install or change.
    """

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__("; ".join(self.problems))


# Failures a rerun of the same phase meets again: a missing file or binary, a refused permission, a bad
# configuration, damaged data, a learner that diverged (every run is seeded), a programming error.
# A crashed env, a lost worker or a refused connection is not among them: those may pass.
NOT_TRANSIENT: tuple[type[BaseException], ...] = (
    ConfigError,
    MappingError,
    RegistryError,
    RequirementError,
    DataFileError,
    NonFiniteError,
    FileNotFoundError,
    PermissionError,
    NotADirectoryError,
    IsADirectoryError,
    ImportError,
    NotImplementedError,
    AttributeError,
    LookupError,
    TypeError,
    ValueError,
)


def is_transient(exc: BaseException) -> bool:
    """Whether retrying what raised ``exc`` may succeed: no for it or any explicit cause of it in ``NOT_TRANSIENT``."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, NOT_TRANSIENT):
            return False
        seen.add(id(current))
        current = current.__cause__
    return True
