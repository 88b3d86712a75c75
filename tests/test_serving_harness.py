"""``sglang_ddtree.serving``: the servers a benchmark or test starts never outlive it.

The launcher is replaced by a sleeping child (``launch_stand_in``): what is specified here is the harness around
it — process groups, SIGTERM, servers started together."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from sglang_ddtree import serving


def launch_stand_in(monkeypatch, unhealthy: set[str] = frozenset()) -> list[subprocess.Popen]:
    """``launched_server`` starts ``sleep`` instead of the launcher and finds it healthy at once (unless its
    ``--model-path`` is in ``unhealthy``); returns the started children."""
    started, real_popen = [], subprocess.Popen

    def popen(command, **kwargs):
        proc = real_popen([sys.executable, "-c", "import time; time.sleep(300)"], **kwargs)
        proc.model_path = command[command.index("--model-path") + 1]
        started.append(proc)
        return proc

    def wait_healthy(proc, base_url, log, timeout):
        if proc.model_path in unhealthy:
            raise serving.ServerStartError(f"server exited with 1:\n{proc.model_path} could not load")

    monkeypatch.setattr(serving.subprocess, "Popen", popen)
    monkeypatch.setattr(serving, "_wait_healthy", wait_healthy)
    return started


def test_servers_started_together_are_all_healthy_before_any_is_used_and_all_stop_after(monkeypatch, tmp_path):
    started = launch_stand_in(monkeypatch)
    specs = {name: (["--model-path", name], None, str(tmp_path / f"{name}.log")) for name in ("ar", "mtp", "ddtree")}
    with serving.launched_servers(specs) as urls:
        assert sorted(urls) == ["ar", "ddtree", "mtp"]
        assert len(set(urls.values())) == 3 and all(url.startswith("http://127.0.0.1:") for url in urls.values())
        assert all(proc.poll() is None for proc in started)
    assert len(started) == 3 and all(proc.poll() is not None for proc in started)


def test_a_server_that_fails_to_start_together_is_named_and_the_others_are_stopped(monkeypatch, tmp_path):
    started = launch_stand_in(monkeypatch, unhealthy={"dflash"})
    specs = {name: (["--model-path", name], None, str(tmp_path / f"{name}.log")) for name in ("ar", "dflash")}
    with pytest.raises(serving.ServerStartError, match=r"^dflash: server exited with 1"):
        with serving.launched_servers(specs):
            pytest.fail("no server is handed out when one of them failed")
    assert len(started) == 2 and all(proc.poll() is not None for proc in started)


def test_a_caller_stopped_by_sigterm_stops_its_server_first(tmp_path):
    """``timeout 120 python -m bench.step_profile ...``: when the deadline's SIGTERM arrives the bench unwinds
    and stops its server's process group. (Before, the server lived on in its own session and kept its GPU
    memory through the next benchmarks of the call.)"""
    pid_file = tmp_path / "server.pid"
    caller = textwrap.dedent(f"""
        import subprocess, sys, time
        from sglang_ddtree import serving
        real_popen = subprocess.Popen
        def popen(command, **kwargs):
            proc = real_popen([sys.executable, "-c", "import time; time.sleep(300)"], **kwargs)
            open({str(pid_file)!r}, "w").write(str(proc.pid))
            return proc
        serving.subprocess.Popen = popen
        serving._wait_healthy = lambda *args: None
        with serving.launched_server(["--model-path", "m"], log_path={str(tmp_path / "server.log")!r}):
            time.sleep(300)
    """)
    proc = subprocess.Popen([sys.executable, "-c", caller])
    deadline = time.monotonic() + 60
    while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
        time.sleep(0.1)
    server_pid = int(pid_file.read_text())
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    with pytest.raises(ProcessLookupError):
        os.kill(server_pid, 0)  # stopped and reaped by the caller before it exited


def test_sigterm_keeps_a_handler_the_caller_installed_itself():
    def own_handler(signum, frame):
        pass

    previous = signal.signal(signal.SIGTERM, own_handler)
    try:
        with serving.sigterm_stops_servers():
            assert signal.getsignal(signal.SIGTERM) is own_handler
    finally:
        signal.signal(signal.SIGTERM, previous)
