"""Driver of `eray-provider run` that says where it runs, does ``batch_driver``'s work (a
task per node, a JAX psum), then waits for SIGTERM and exits 7 on it: a signal to `run`
reaches the command."""

from __future__ import annotations

import signal
import sys
import time

import batch_driver


def on_term(_signum, _frame) -> None:
    print("GOT TERM", flush=True)
    sys.exit(7)


if __name__ == "__main__":
    print("DRIVER", sys.executable, flush=True)
    batch_driver.main(0)
    signal.signal(signal.SIGTERM, on_term)
    print("WAITING", flush=True)
    time.sleep(600)
    sys.exit(1)
