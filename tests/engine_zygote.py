"""A process that imports SGLang once and forks one child per engine run of ``support.run_engine_generate``.

An engine run in a fresh interpreter spent ~8 s importing SGLang before SGLang spawned its scheduler, which imports
it again: ~17 s of a ~20 s run on CI's machine, over some 70 runs. A child forked from here skips the first import.
SGLang still spawns its scheduler and TP ranks (``spawn``, as in production): fresh interpreters with the run's
environment, where the plugin, the CPU shims and the injected faults load as they do in a server.

Protocol, one run at a time, one JSON object per line. In: ``{"request": engine_generate's request, "env": the
child's whole environment, "cwd": ..., "stdout": PATH, "stderr": PATH}``. Out: ``{"pid": PID}`` once the child is
forked (it leads a session of its own, so its process group can be killed), then ``{"returncode": RC}``.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import traceback

import engine_generate


def _redirect(fd: int, path: str, flags: int = os.O_WRONLY | os.O_CREAT | os.O_TRUNC) -> None:
    target = os.open(path, flags, 0o644)
    os.dup2(target, fd)
    os.close(target)


def _child(job: dict) -> int:
    """The engine run itself, in the forked child: its own session, environment, directory and output files."""
    os.setsid()
    os.environ.clear()
    os.environ.update(job["env"])
    os.chdir(job["cwd"])
    _redirect(0, os.devnull, os.O_RDONLY)  # the zygote's stdin carries the protocol
    _redirect(1, job["stdout"])
    _redirect(2, job["stderr"])
    try:
        print(json.dumps(engine_generate.run(job["request"]), default=str))
        return 0
    except BaseException:
        traceback.print_exc()
        return 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


def main() -> None:
    replies = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # stray prints of the imports must not reach the protocol
    for module in ("sglang", "sglang.srt.entrypoints.engine"):  # what every child inherits
        importlib.import_module(module)
    for line in sys.stdin:
        job = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                code = _child(job)
            finally:
                os._exit(code)  # not the zygote's exit handlers
        replies.write(json.dumps({"pid": pid}) + "\n")
        _, status = os.waitpid(pid, 0)
        replies.write(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}) + "\n")


if __name__ == "__main__":
    main()
