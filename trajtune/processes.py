"""Helper processes' lifetime: none outlives the process it serves. No torch import (a reward worker
imports this before anything heavy)."""

from __future__ import annotations

import os
import threading
import time


def exit_with_parent(parent: int | None = None) -> None:
    """In a child process: a daemon thread that ends this process (`os._exit(1)`) once `parent` (default:
    the current parent) is gone, even one killed with -9, so no worker outlives the process it serves."""

    def watch(pid: int) -> None:
        while os.getppid() == pid:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, args=(os.getppid() if parent is None else parent,), daemon=True).start()
