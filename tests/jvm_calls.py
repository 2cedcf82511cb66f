"""Counting the commands Python sends to Spark's JVM, for tests that bound how many round trips an API call costs."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

from py4j import protocol
from py4j.clientserver import ClientServerConnection
from py4j.java_gateway import GatewayConnection

# Py4J tells the JVM that Python garbage-collected a JavaObject with a memory command; when Python's collector runs
# depends on what ran before (CI saw 206 and 217 commands inside counted loops that send 91 calls in a fresh process).
_RELEASE = protocol.MEMORY_COMMAND_NAME


class RoundTrips:
    """The commands sent while counting, by their first line (``c`` call, ``r`` reflection, ...)."""

    def __init__(self) -> None:
        self.commands: list[str] = []

    @property
    def calls(self) -> int:
        return len(self.commands)


@contextmanager
def counting_round_trips() -> Iterator[RoundTrips]:
    """Counts every command Python sends to the JVM except releases of collected objects; the collector runs before
    the count and is held off during it, so the figure is the counted code's own."""
    counter = RoundTrips()
    patched = []
    gc.collect()
    gc.disable()
    try:
        for cls in (ClientServerConnection, GatewayConnection):
            original = cls.send_command

            def send(self, command, *args, _original=original, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
                if not command.startswith(_RELEASE):
                    counter.commands.append(command.split("\n", 1)[0])
                return _original(self, command, *args, **kwargs)

            cls.send_command = send
            patched.append((cls, original))
        yield counter
    finally:
        for cls, original in patched:
            cls.send_command = original
        gc.enable()
