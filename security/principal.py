"""A principal: who a client is once authenticated, written as Kafka writes it ("User:alice")."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Principal:
    type: str
    name: str

    def __str__(self) -> str:
        return f"{self.type}:{self.name}"

    @classmethod
    def parse(cls, text: str) -> "Principal":
        """'User:alice' -> Principal('User', 'alice'); the type is required, as in Kafka's ACLs."""
        kind, sep, name = text.partition(":")
        if not sep or not kind or not name:
            raise ValueError(f"a principal is written TYPE:NAME (e.g. User:alice), not {text!r}")
        return cls(kind, name)

    @classmethod
    def user(cls, name: str) -> "Principal":
        return cls("User", name)


# A client on a listener without authentication (Kafka's KafkaPrincipal.ANONYMOUS).
ANONYMOUS = Principal("User", "ANONYMOUS")
