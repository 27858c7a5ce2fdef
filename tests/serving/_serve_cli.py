"""``transformers serve`` as a user runs it, on the simulated TPU, for the serving workers (not a test module).

The command runs in a process of its own, with ``TRANSFORMERS_TPU_EXT_SIMULATE`` (the plugin installs the
simulated TPU at ``import torch`` in it and in every process it starts) and
``TRANSFORMERS_TPU_EXT_SIMULATE_REPORT`` (each of those processes reports what it compiled and which patches
it applied: ``transformers_tpu_ext.testing.report``). Transformers 5.25 runs the model in a spawned process
named ``"model"`` (``transformers/cli/serving/model_manager.py``); 5.24 runs it in the command's own
process: :meth:`Served.engine` reads the report of whichever holds the model.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from typing import Any

from transformers_tpu_ext.testing import report


class Served:
    def __init__(self, model: str, simulate: str = "chips=1,hbm=128MiB", timeout: float = 600) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.model, self.url = model, f"http://127.0.0.1:{port}"
        work = tempfile.mkdtemp()
        self.reports, self.log = os.path.join(work, "reports"), os.path.join(work, "serve.log")
        env = {**os.environ, "TRANSFORMERS_TPU_EXT_SIMULATE": simulate, "TRANSFORMERS_TPU_EXT_SIMULATE_REPORT": self.reports}
        cli = os.path.join(os.path.dirname(sys.executable), "transformers")
        self.server = subprocess.Popen(
            [cli, "serve", model, "--continuous-batching", "--port", str(port), "--host", "127.0.0.1"],
            env=env, stdout=subprocess.DEVNULL, stderr=open(self.log, "w"), start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.server.poll() is not None:
                raise RuntimeError(f"transformers serve exited ({self.server.returncode}):\n{self.tail()}")
            try:
                urllib.request.urlopen(self.url + "/health", timeout=1)
                return
            except Exception:
                time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"transformers serve did not answer /health in {timeout}s:\n{self.tail()}")

    def call(self, method: str, route: str, body: dict | None = None, timeout: float = 600) -> tuple[int, Any]:
        data = None if body is None else json.dumps({"model": self.model, **body}).encode()
        request = urllib.request.Request(self.url + route, data=data, method=method, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return response.status, json.loads(response.read() or b"null")
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode()[:400]

    def engine(self) -> dict:
        """The latest report of the process that runs the model (5.25: the spawned ``"model"``; 5.24: the
        command's own). Its ``counters`` are what that process compiled; ``patches`` the plugin's state there."""
        reports = report.read(self.reports)
        named = [r for r in reports if r["process"] == "model"]
        if named:
            return named[-1]
        (own,) = [r for r in reports if r["pid"] == self.server.pid]
        return own

    def programs(self) -> int:
        return self.engine()["counters"]["programs"]

    def tail(self, chars: int = 3000) -> str:
        try:
            return open(self.log).read()[-chars:]
        except OSError:
            return ""

    def stop(self) -> None:
        if self.server.poll() is None:
            os.killpg(self.server.pid, signal.SIGTERM)  # the server and the model's process it started
            try:
                self.server.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.server.pid, signal.SIGKILL)
                self.server.wait(60)

    def __enter__(self) -> Served:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
