"""Errors of the schema registry, each with the Confluent registry's error code and HTTP status."""
from __future__ import annotations

from fluvial.errors import FluvialError, InvalidConfigError


class RegistryError(FluvialError):
    """An error the registry reports as `{"error_code": ..., "message": ...}`."""

    error_code: int = 50001
    http_status: int = 500

    def __init__(self, message: str = ""):
        super().__init__(message)


class SubjectNotFoundError(RegistryError):
    error_code = 40401
    http_status = 404


class VersionNotFoundError(RegistryError):
    error_code = 40402
    http_status = 404


class SchemaNotFoundError(RegistryError):
    error_code = 40403
    http_status = 404


class SubjectSoftDeletedError(RegistryError):
    error_code = 40404
    http_status = 404


class SubjectNotSoftDeletedError(RegistryError):
    error_code = 40405
    http_status = 404


class SchemaVersionSoftDeletedError(RegistryError):
    error_code = 40406
    http_status = 404


class SchemaVersionNotSoftDeletedError(RegistryError):
    error_code = 40407
    http_status = 404


class SubjectConfigNotFoundError(RegistryError):
    error_code = 40408
    http_status = 404


class IncompatibleSchemaError(RegistryError):
    error_code = 409
    http_status = 409


class InvalidSchemaError(RegistryError):
    error_code = 42201
    http_status = 422


class InvalidVersionError(RegistryError):
    error_code = 42202
    http_status = 422


class InvalidCompatibilityLevelError(RegistryError):
    error_code = 42203
    http_status = 422


class UnsupportedSchemaError(InvalidConfigError):
    """A valid schema that a table cannot hold (e.g. a union of two non-null types)."""


class InvalidSubjectError(RegistryError):
    """A subject name the registry does not accept (see docs/architecture.md, "Schema registry")."""
    error_code = 42208
    http_status = 422
