"""Which process of a torchrun launch this is, from the environment torchrun sets: only the
main process reports to the user (one line per error, one copy of each note)."""

from __future__ import annotations

import os


def is_main_process() -> bool:
    """Whether this process reports: the only process, or rank 0 under torchrun (``RANK``)."""
    return os.environ.get("RANK", "0") in ("", "0")


def check_one_process(command: str) -> None:
    """Only ``train`` spreads over torchrun's processes; any other command under torchrun would
    run whole on every process (each writing the same outputs): refused in one line."""
    from sciformer.errors import ConfigError

    if command != "train" and world_size() > 1:
        raise ConfigError(f"sciformer {command} runs in one process; run it without torchrun (only train spreads over processes)")


def world_size() -> int:
    """torchrun's ``WORLD_SIZE`` (1 when unset, empty or not a whole number: set by something else)."""
    try:
        return int(os.environ.get("WORLD_SIZE", "1") or "1")
    except ValueError:
        return 1


def machines_of_launch() -> int:
    """How many machines torchrun spread this launch over: 1 when every process is local
    (``LOCAL_WORLD_SIZE`` equals ``WORLD_SIZE``) or when torchrun did not say."""
    try:
        local = int(os.environ.get("LOCAL_WORLD_SIZE", "") or world_size())
    except ValueError:
        return 1
    return 1 if local <= 0 or local >= world_size() else -(-world_size() // local)
