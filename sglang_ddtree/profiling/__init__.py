"""Where a decode step's time goes, off by default: GPU phase events, host-timed ranges and sync debug, and the
cProfile of the host step, all reported on ``/server_info`` for ``bench.step_profile``."""
