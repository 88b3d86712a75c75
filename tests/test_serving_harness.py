"""``sglang_ddtree.serving``: the servers a benchmark or test starts never outlive it.

The launcher is replaced by a sleeping (or failing, or /health-answering) child: what is specified here is the
harness around it (process group, SIGTERM, starts that lose a port race)."""

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


HEALTH_SERVER = textwrap.dedent("""
    import http.server, sys
    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()
        def log_message(self, *args):
            pass
    http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Health).serve_forever()
""")


def launcher_replaced_by(monkeypatch, first_start: str) -> list[str]:
    """Each start's ``--port``; the first start runs ``first_start`` (Python), later ones answer /health."""
    starts, real_popen = [], subprocess.Popen

    def popen(command, **kwargs):
        starts.append(command[command.index("--port") + 1])
        script = [first_start] if len(starts) == 1 else [HEALTH_SERVER, starts[-1]]
        return real_popen([sys.executable, "-c", *script], **kwargs)

    monkeypatch.setattr(serving.subprocess, "Popen", popen)
    return starts


def test_a_start_that_loses_a_port_to_a_neighbour_is_tried_again_on_a_fresh_port(tmp_path, monkeypatch):
    """Servers and engines started side by side race for free ports (SGLang's torch.distributed port is free when
    picked, bound later): a start that dies with EADDRINUSE is tried again, and the URL is the one that answered."""
    clash = "print('torch.distributed.DistNetworkError: port: 39081, code: -98, name: EADDRINUSE'); raise SystemExit(1)"
    starts = launcher_replaced_by(monkeypatch, clash)
    with serving.launched_server(["--model-path", "m"], log_path=str(tmp_path / "server.log")) as url:
        assert url == f"http://127.0.0.1:{starts[-1]}"
    assert len(starts) == 2 and starts[0] != starts[1]


def test_a_start_that_fails_for_another_reason_is_not_tried_again(tmp_path, monkeypatch):
    starts = launcher_replaced_by(monkeypatch, "print('ValueError: no such model'); raise SystemExit(1)")
    with pytest.raises(serving.ServerStartError, match="no such model"):
        with serving.launched_server(["--model-path", "m"], log_path=str(tmp_path / "server.log")):
            pass
    assert len(starts) == 1
