"""Showing files to humans: a path found by handle at display time, printed safely.

Files are (dev, inode, generation) everywhere in cachepilot; a path is only looked up when a person asks
(`cachepilot top`), by opening the file by handle on its filesystem and reading back the name the kernel has for
it. Names are hostile input, and so is whatever the daemon sends (it repeats names it read): ``escape`` is the one
function every human output (status, top, explain, clear-latch, the CLI's error line) passes them through.
"""

from __future__ import annotations

import errno
import os

from cachepilot.handles import open_by_handle  # the one open_by_handle_at (ext4 handles)


def escape(text: str, *, backslash: bool = True) -> str:
    """Text that cannot move the cursor, reorder or hide what follows: every character Python does not call
    printable (C0 and C1 controls, DEL; format characters such as the bidirectional override U+202E, the isolates
    and the zero-width ones; line and paragraph separators; spaces other than ' '; unassigned and private-use code
    points) and every undecodable byte becomes an escape: \\xNN, \\uNNNN or \\UNNNNNNNN. A backslash is doubled, so
    an escape is never ambiguous, unless ``backslash`` is False (a message that carries its own escapes, from
    ``ascii()``, stays readable)."""
    if text.isprintable() and "\\" not in text:
        return text  # the common case, at no cost
    out = []
    for ch in text:
        o = ord(ch)
        if 0xDC80 <= o <= 0xDCFF:  # surrogateescape'd byte of invalid UTF-8
            out.append(f"\\x{o - 0xDC00:02x}")
        elif ch == "\\":
            out.append("\\\\" if backslash else ch)
        elif ch.isprintable():
            out.append(ch)
        else:
            out.append(f"\\x{o:02x}" if o <= 0xFF else f"\\u{o:04x}" if o <= 0xFFFF else f"\\U{o:08x}")
    return "".join(out)


def path_of(mount_path: str, ino: int, gen: int) -> str:
    """The file's current path for display (escaped), or why there is none, in angle brackets."""
    if not mount_path:
        return f"<ino {ino}: filesystem not mounted>"
    if not 0 <= ino < 1 << 32:
        return f"<ino {ino}: no ext4 handle for it>"
    try:
        mfd = os.open(mount_path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            fd = open_by_handle(mfd, ino, gen, os.O_PATH | os.O_CLOEXEC)
        finally:
            os.close(mfd)
    except OSError as exc:
        why = "gone" if exc.errno in (errno.ESTALE, errno.ENOENT) else (exc.strerror or str(exc))
        return f"<ino {ino}: {why}>"
    try:
        target = os.readlink(f"/proc/self/fd/{fd}")
    except OSError as exc:
        return f"<ino {ino}: {exc.strerror}>"
    finally:
        os.close(fd)
    return escape(target)
