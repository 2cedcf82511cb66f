"""A real S3-compatible HTTP server for tests and test-like commands: moto's standalone server on 127.0.0.1 with a
bucket ``lake``, its address and credentials in the ``IMP_S3_*`` variables while it runs (as a user would configure
them; delta-rs and Spark's S3A both read them through ``imp_core.sources.storage``)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType

import requests

CREDENTIALS = {"IMP_S3_REGION": "us-east-1", "IMP_S3_ACCESS_KEY_ID": "imp-test-key",
               "IMP_S3_SECRET_ACCESS_KEY": "imp-test-secret-value", "IMP_S3_PATH_STYLE": "true"}


class S3Server:
    """``with S3Server(folder) as server:`` the server runs (its log in ``folder``) and ``server.endpoint`` is set."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.endpoint = ""
        self._proc: subprocess.Popen | None = None
        self._saved: dict[str, str | None] = {}

    def __enter__(self) -> S3Server:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        binary = Path(sys.executable).with_name("moto_server")
        assert binary.exists() or shutil.which("moto_server"), "moto_server is missing: run ./dev test"
        log = self.folder / "moto.log"
        self._proc = subprocess.Popen([str(binary if binary.exists() else "moto_server"), "-H", "127.0.0.1", "-p",
                                       str(port)], stdout=open(log, "w"), stderr=subprocess.STDOUT,
                                      start_new_session=True)
        self.endpoint = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            assert self._proc.poll() is None, log.read_text()
            try:
                # moto builds its backends on the first request: under load that answer takes seconds
                requests.get(self.endpoint, timeout=30)
                break
            except requests.RequestException:
                assert time.monotonic() < deadline, "the S3 server did not come up"
                time.sleep(0.2)
        env = {"IMP_S3_ENDPOINT": self.endpoint, **CREDENTIALS}
        self._saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        requests.put(f"{self.endpoint}/lake", timeout=10).raise_for_status()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        for k, v in self._saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        if self._proc is not None:
            os.killpg(self._proc.pid, signal.SIGTERM)
            self._proc.wait(timeout=20)


__all__ = ["S3Server"]
