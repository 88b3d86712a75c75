"""Run ``python -m sglang_ddtree.launch`` as a child process: for benchmarks, tests and scripts.

:func:`launched_server` starts the launcher in its own process group, waits until ``/health`` answers 200 and
stops the whole group (scheduler and detokenizer children included) on exit, also when the caller is stopped by
SIGTERM (``timeout``'s signal): left behind, a server of a benchmark cut by its deadline kept its GPU memory
through the next ones (tests/gpu/RESULTS.md run 40). A start that fails because a port was taken meanwhile is
retried on fresh ports (:func:`port_clash`).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Iterator, Optional


class ServerStartError(RuntimeError):
    """The server exited or did not become healthy; the message ends with the tail of its log."""


def server_state(url: str, key: str) -> Optional[dict]:
    """One entry of a running server's ``/server_info`` scheduler state (the plugin's reports), else None."""
    with urllib.request.urlopen(url.rstrip("/") + "/server_info", timeout=60) as response:
        return json.loads(response.read())["internal_states"][0].get(key)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


START_ATTEMPTS = 3


def port_clash(message: str) -> bool:
    """Whether a failed start says a port it bound was taken. Servers and engines starting side by side race for
    free ports: the HTTP port chosen here and SGLang's torch.distributed port (``get_free_port``: free when
    asked, bound later) can be handed to two of them (tests/gpu/RESULTS.md run 54, a CI engine test)."""
    return "EADDRINUSE" in message or "address already in use" in message.lower()


PATH_FLAGS = ("--model-path", "--draft-model-path", "--speculative-draft-model-path", "--tokenizer-path")


def absolute_local_paths(args: list[str]) -> list[str]:
    """``args`` with the local paths of :data:`PATH_FLAGS` made absolute: the child runs in another folder, so a
    path relative to the caller's would name nothing there (hub ids, not local paths, are kept as they are)."""
    out = list(args)
    for i, arg in enumerate(out):
        flag, equals, value = arg.partition("=")
        if flag in PATH_FLAGS and equals and os.path.exists(value):
            out[i] = f"{flag}={os.path.abspath(value)}"
        elif arg in PATH_FLAGS and i + 1 < len(out) and os.path.exists(out[i + 1]):
            out[i + 1] = os.path.abspath(out[i + 1])
    return out


def default_log_path(port: int) -> str:
    return os.path.join(os.environ.get("TMPDIR", "/tmp"), f"sglang_ddtree_server_{port}.log")


@contextmanager
def launched_server(
    args: list[str],
    port: Optional[int] = None,
    *,
    env: Optional[dict[str, str]] = None,
    log_path: Optional[str] = None,
    ready_timeout: float = 300,
) -> Iterator[str]:
    """Start ``python -m sglang_ddtree.launch ARGS --port PORT`` and yield its base URL once it is healthy.

    The child runs outside the checkout, so that it serves the installed package (the one SGLang's plugin entry
    point loads in every process it starts). Model and drafter paths relative to the caller's folder are passed on
    as absolute paths. A start that fails on a taken port (:func:`port_clash`) is tried again on a fresh port, up to
    :data:`START_ATTEMPTS` starts in all; any other failure raises :class:`ServerStartError` at once.
    """
    with sigterm_stops_servers():
        for attempt in range(1, START_ATTEMPTS + 1):
            server_port = port if port is not None and attempt == 1 else free_port()
            log = open(log_path or default_log_path(server_port), "w+")
            proc = subprocess.Popen(
                [sys.executable, "-m", "sglang_ddtree.launch", *absolute_local_paths(args), "--port", str(server_port)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, **(env or {})},
                cwd=os.environ.get("TMPDIR", "/tmp"),
                start_new_session=True,
            )
            base_url = f"http://127.0.0.1:{server_port}"
            try:
                _wait_healthy(proc, base_url, log, ready_timeout)
                break
            except BaseException as error:
                _stop(proc)
                log.close()
                if not isinstance(error, ServerStartError) or attempt == START_ATTEMPTS or not port_clash(str(error)):
                    raise
        try:
            yield base_url
        finally:
            _stop(proc)
            log.close()


def _raise_system_exit(signum: int, frame) -> None:
    raise SystemExit(128 + signum)


def sigterm_stops_servers() -> AbstractContextManager[None]:
    """While it is entered, SIGTERM unwinds the main thread (so the ``finally`` of each :func:`launched_server`
    stops its server's process group) instead of killing the process outright. A no-op outside the main thread
    or where SIGTERM already has a handler."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        return nullcontext()
    return _signal_handler(signal.SIGTERM, _raise_system_exit)


@contextmanager
def _signal_handler(signum: int, handler) -> Iterator[None]:
    previous = signal.signal(signum, handler)
    try:
        yield
    finally:
        signal.signal(signum, previous)


def _wait_healthy(proc: subprocess.Popen, base_url: str, log, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ServerStartError(f"server exited with {proc.returncode}:\n{_tail(log)}")
        try:
            with urllib.request.urlopen(base_url + "/health", timeout=5) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(1)
    raise ServerStartError(f"server not healthy after {timeout}s:\n{_tail(log)}")


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _tail(log, chars: int = 6000) -> str:
    log.flush()
    log.seek(0)
    return log.read()[-chars:]
