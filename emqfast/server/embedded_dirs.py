"""Directories only we can write, for the embedded Redis.

The state dir (created 0700, or checked: ours, not writable by others, and made 0700 when
others could read it) holds the data, payloads included;
the per-user socket dir for long state-dir paths must be exactly ours and 0700, and is
never followed through a symlink: another user could have planted it to stand in for
our server. :mod:`emqfast.server.embedded` says which directories these are.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Optional

from emqfast.core.errors import ConnectionFailed

WHAT_TO_DO = ("Set EMQ_STATE_DIR to a directory you own (mode 700), or EMQ_REDIS_URL "
              "to use a Redis server of your own.")


def state_dir_error(directory: Path, why: str) -> ConnectionFailed:
    """The error for a state dir that cannot be used, saying what to do."""
    return ConnectionFailed(
        f"the embedded Redis cannot use its state dir {directory} (EMQ_STATE_DIR): {why}. "
        + WHAT_TO_DO)


def owner_only_problem(st: os.stat_result, exact_0700: bool) -> Optional[str]:
    """Why a directory with this stat is not one only we can write (None when it is)."""
    if not stat.S_ISDIR(st.st_mode):
        return "it is not a directory"
    if st.st_uid != os.geteuid():
        return f"it is owned by uid {st.st_uid}, not by you (uid {os.geteuid()})"
    loose = st.st_mode & (0o077 if exact_0700 else 0o022)
    if loose:
        return (f"its mode is {stat.S_IMODE(st.st_mode):04o}: "
                f"{'others can reach it' if exact_0700 else 'others can write to it'}")
    return None


def prepare_state_dir(directory: Path) -> None:
    """Create the state dir (0700) or check the existing one is usable and only ours: one
    owned by someone else or writable by others is refused (they could have planted
    files in it); one of ours that others can merely read or enter is made 0700."""
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = directory.stat()
    except FileExistsError:
        raise state_dir_error(directory, "a file of that name exists") from None
    except NotADirectoryError:
        raise state_dir_error(directory, "a parent of it is a file, not a directory") from None
    except PermissionError as exc:
        raise state_dir_error(directory, f"permission denied ({exc.strerror})") from None
    except OSError as exc:
        raise state_dir_error(directory, exc.strerror or str(exc)) from None
    problem = owner_only_problem(st, exact_0700=False)
    if problem:
        raise state_dir_error(directory, problem)
    if not os.access(directory, os.W_OK | os.X_OK):
        raise state_dir_error(directory, "it is not writable by you")
    if stat.S_IMODE(st.st_mode) & 0o077:  # ours, but others may read it: the data is private
        try:
            os.chmod(directory, 0o700)
        except OSError as exc:
            raise state_dir_error(directory, f"its mode is {stat.S_IMODE(st.st_mode):04o} "
                                  f"and it cannot be made 0700 ({exc.strerror})") from None


def prepare_runtime_dir(directory: Path) -> None:
    """Create the per-user socket dir 0700, or refuse one we do not own or that is looser
    (another user could have pre-created it to stand in for our server)."""
    try:
        os.mkdir(directory, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise ConnectionFailed(
            f"the embedded Redis cannot create its socket dir {directory}: "
            f"{exc.strerror or exc}. " + WHAT_TO_DO + " (a shorter state dir path keeps "
            "the socket inside it)") from None
    st = os.lstat(directory)  # lstat: a symlink planted there is refused, not followed
    problem = "it is a symlink" if stat.S_ISLNK(st.st_mode) else \
        owner_only_problem(st, exact_0700=True)
    if problem:
        raise ConnectionFailed(
            f"refusing the embedded Redis socket dir {directory}: {problem}. Someone else "
            f"may have created it; remove it (it must be yours, mode 0700), or use a state "
            f"dir path short enough to hold the socket, or set EMQ_REDIS_URL")


def dir_problem(directory: Path, exact_0700: bool) -> Optional[str]:
    """Why ``directory`` must not be trusted now (None when it is fine or absent)."""
    try:
        st = os.lstat(directory)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return exc.strerror or str(exc)
    if stat.S_ISLNK(st.st_mode):
        return "it is a symlink"
    return owner_only_problem(st, exact_0700=exact_0700)
