"""Signalling a process group we started with `start_new_session=True`."""
from __future__ import annotations

import contextlib
import os
import signal


def signal_group(pgid: int, sig: int = signal.SIGKILL) -> bool:
    """Send `sig` to the whole group: engines and builds start helpers that outlive their leader.

    A group that is already gone (or, after a pid reuse, no longer ours) is not an error: the
    caller wanted it gone. Returns whether the signal was delivered."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)
        return True
    return False
