"""``sglang_ddtree.serving``: the servers a benchmark or test starts never outlive it.

The launcher is replaced by a sleeping child: what is specified here is the harness around it (process group,
SIGTERM)."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from sglang_ddtree import serving


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
