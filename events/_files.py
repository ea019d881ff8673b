"""Files written whole or not at all, never through a name someone planted.

Every file the distribution writes besides the event logs (manifests, run
claims, collected logs, trace files, HTML reports) goes through
:func:`write_file`: the content goes to a temporary file of a unique name
in the target's directory, created exclusively and without following a
link (``O_EXCL | O_NOFOLLOW``), synced, then renamed to the target. A
rename replaces a link at the target instead of writing through it, and a
reader never sees half a file. Internal.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

__all__: list[str] = []

_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


def _temporary(path: Path) -> tuple[Path, int]:
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}")
    return temporary, os.open(temporary, _FLAGS, 0o644)


def write_file(path: Path, content: bytes, *, exclusive: bool = False) -> bool:
    """Write ``content`` to ``path`` whole: replaced at once, or, with
    ``exclusive``, created only if nothing has that name (a hard link of the
    complete temporary file; ``False`` when the name is taken).

    Raises:
        OSError: the directory cannot be written (nothing is left in it).
    """
    temporary, fd = _temporary(path)
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(content)
            file.flush()
            os.fsync(file.fileno())
        if not exclusive:
            os.replace(temporary, path)
            return True
        try:
            os.link(temporary, path, follow_symlinks=False)
        except FileExistsError:
            return False
        return True
    finally:
        with contextlib.suppress(OSError):
            os.unlink(temporary)


def check_writable(path: Path) -> None:
    """Whether :func:`write_file` could write ``path``, asked before any work
    is done and leaving nothing behind (no empty file at ``path``).

    Raises:
        OSError: ``path`` is a directory, or its directory cannot be written.
    """
    if path.is_dir() and not path.is_symlink():
        raise IsADirectoryError(21, "Is a directory", str(path))
    temporary, fd = _temporary(path)
    os.close(fd)
    os.unlink(temporary)
