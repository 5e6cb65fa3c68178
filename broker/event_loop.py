"""Which event loop runs the broker: asyncio's (the default) or uvloop's (libuv, in C).

Many small producers make the loop's own machinery a good part of a request's cost: every
one-record produce request passes through several callbacks (the socket read, the
connection's task, the fsync's completion, the answer's write), each a Python-level
`Handle` in asyncio's loop. uvloop runs the same asyncio API (tasks, futures, streams,
buffered protocols, executors, signals) with those steps in C: `--event-loop uvloop`.
It stays opt-in: measured on the small-request benchmark it saved only about 5% of the
broker's CPU per one-record produce request (the handler's Python work dominates), and
only the Kafka-path tests (compatibility, SASL, fuzzing, frames) have run on it so far.
"auto" picks uvloop where it is installed, except where asyncio's loop is needed:
asyncio's debug mode (`--slow-callback-ms`) names the slow callback only on asyncio's loop,
and a listener with TLS keeps asyncio's TLS (the server-side handshake, its timeout and the
peer certificate of mutual TLS are what the TLS tests check; uvloop's TLS transport closes
some of those connections differently).
"""
from __future__ import annotations

import asyncio
import importlib.util
from typing import Any, Coroutine

CHOICES = ("auto", "uvloop", "asyncio")


def uvloop_available() -> bool:
    return importlib.util.find_spec("uvloop") is not None


def resolve(choice: str, debug: bool = False, tls: bool = False) -> str:
    """The loop that `choice` gives on this machine: "uvloop" or "asyncio". ``tls``: a
    listener of the broker uses TLS."""
    if choice not in CHOICES:
        raise ValueError(f"event loop must be one of {', '.join(CHOICES)}, not {choice!r}")
    if debug or choice == "asyncio":
        return "asyncio"
    if choice == "uvloop":
        if not uvloop_available():
            raise RuntimeError("--event-loop uvloop: the uvloop package is not installed")
        return "uvloop"
    return "uvloop" if uvloop_available() and not tls else "asyncio"


def run(main: Coroutine[Any, Any, Any], choice: str = "auto", debug: bool = False, tls: bool = False) -> Any:
    """Run ``main`` to completion on a new loop of the resolved kind."""
    if resolve(choice, debug, tls) == "uvloop":
        import uvloop
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            return runner.run(main)
    return asyncio.run(main)


def running_loop_name() -> str:
    """"uvloop" or "asyncio": what the running loop is (for the status page and tests)."""
    return "uvloop" if type(asyncio.get_running_loop()).__module__.startswith("uvloop") else "asyncio"
