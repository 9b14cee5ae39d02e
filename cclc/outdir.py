"""Writing into an output folder without clobbering the user's files.

cclc records every file it writes in a manifest, ``.cclc-manifest.json``, in the folder. A file
cclc wrote before may be replaced; any other existing file is refused unless ``force`` is set,
so ``cclc compile -o .`` cannot silently overwrite a source file. Each file is written to a
temporary file beside it and moved into place with :func:`os.replace`, so a reader (or a crash)
never sees half a file.

A run holds the folder's lock while it writes (``with OutputDir(...) as out:``): an OS lock
(:func:`fcntl.flock`) on ``.cclc-lock`` in the folder, so a second run into the same folder is
refused at once instead of mixing its files with the first run's; the OS drops the lock when
its process ends however it ends, so a lock file a killed run left behind blocks nothing. The
holder removes the lock file when it is done.

A single file the user names (``cclc viz -o page.html``, ``cclc diagnose --patch fixed.ccl``,
:func:`cclc.serialize.save`) goes through the same writer: :func:`write_file` writes it into
the :class:`OutputDir` of its folder, under the same rules.

>>> import tempfile
>>> with OutputDir(tempfile.mkdtemp()) as out:
...     out.write_text("a.json", "{}")
'a.json'
>>> out.files()
('a.json',)
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path, PurePosixPath

from cclc.errors import CclError

__all__ = ["LOCK", "MANIFEST", "OutputDir", "write_atomically", "write_file"]

#: the manifest's file name inside an output folder
MANIFEST = ".cclc-manifest.json"
#: the lock file's name inside an output folder (present only while a run writes)
LOCK = ".cclc-lock"
_FORMAT = "cclc-manifest"
_VERSION = 1


class OutputDir:
    """An output folder (created if missing) that cclc writes files into.

    ``force`` allows replacing files cclc did not write. Names are relative POSIX paths inside
    the folder (``"nccl/a2a.cu"``); sub-folders are created as needed. Entering it (``with``)
    takes the folder's lock for the whole run (re-entering the same object nests); a
    :class:`~cclc.errors.CclError` says so when another run holds it.
    """

    def __init__(self, path: str | os.PathLike, force: bool = False):
        if os.fspath(path) == "":
            # Path("") is the current folder: an empty -o is a mistake, not a request for "."
            raise CclError("the output folder name is empty; name a folder (-o . for the "
                           "current one)")
        self.path = Path(path)
        self.force = force
        self._lock: _FolderLock | None = None
        self._depth = 0
        if self.path.exists() and not self.path.is_dir():
            raise CclError(f"output path '{self.path}' exists and is not a folder")
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise CclError(f"cannot create output folder '{self.path}': {err.strerror}") from None
        self._files = self._read_manifest()

    def __fspath__(self) -> str:
        return os.fspath(self.path)

    def __repr__(self) -> str:
        return f"OutputDir({os.fspath(self.path)!r}, force={self.force})"

    # -- the lock ----------------------------------------------------------------------------
    def __enter__(self) -> OutputDir:
        if self._depth == 0:
            lock = _FolderLock.acquire(self.path)
            try:
                # the manifest as the previous run left it: read under the lock
                self._files = self._read_manifest()
            except BaseException:
                lock.release()
                raise
            self._lock = lock
        self._depth += 1
        return self

    def __exit__(self, *exc: object) -> None:
        self._depth -= 1
        if self._depth == 0 and self._lock is not None:
            self._lock.release()
            self._lock = None

    @property
    def locked(self) -> bool:
        """Whether this object holds the folder's lock now."""
        return self._lock is not None

    # -- manifest ----------------------------------------------------------------------------
    def _read_manifest(self) -> set[str]:
        target = self.path / MANIFEST
        if not target.exists():
            return set()
        try:
            doc = json.loads(target.read_text(encoding="utf-8"))
        except (OSError, ValueError, RecursionError) as err:
            raise CclError(f"cannot read the manifest '{target}': {err}; delete it to start "
                           "over") from None
        if (not isinstance(doc, dict) or doc.get("format") != _FORMAT
                or not isinstance(doc.get("files"), list)):
            raise CclError(f"'{target}' is not a cclc manifest; delete it to start over")
        return {str(f) for f in doc["files"]}

    def files(self) -> tuple[str, ...]:
        """The files cclc has written into this folder (sorted)."""
        return tuple(sorted(self._files))

    def owns(self, name: str) -> bool:
        return self._normalize(name) in self._files

    # -- writing -----------------------------------------------------------------------------
    def _normalize(self, name: str) -> str:
        p = PurePosixPath(str(name).replace(os.sep, "/"))
        if p.is_absolute() or not p.parts or ".." in p.parts or p.name in (MANIFEST, LOCK):
            raise CclError(f"'{name}' is not a file name inside the output folder")
        return p.as_posix()

    def path_for(self, name: str) -> Path:
        """Where ``name`` lands (checked to stay inside the folder)."""
        return self.path / self._normalize(name)

    def write_bytes(self, name: str, data: bytes | Iterable[bytes]) -> str:
        """Write ``data`` (or its pieces, as they come) to ``name`` atomically; returns the
        normalized name.

        :class:`~cclc.errors.CclError` if ``name`` exists and cclc did not write it (unless
        ``force``), or when the file system refuses. Outside a ``with`` block the write takes
        the folder's lock for itself.
        """
        with self:
            return self._write_locked(name, data)

    def _write_locked(self, name: str, data: bytes | Iterable[bytes]) -> str:
        rel = self._normalize(name)
        target = self.path / rel
        if target.exists() and rel not in self._files and not self.force:
            raise CclError(f"refusing to overwrite '{target}': cclc did not write it "
                           "(use --force to replace it)")
        if target.exists() and not target.is_file():
            raise CclError(f"cannot write '{target}': it exists and is not a regular file")
        # the manifest goes first: a crash between the two leaves a listed file that is
        # missing (harmless), never an unlisted file cclc wrote
        if rel not in self._files:
            self._files.add(rel)
            self._save_manifest()
        write_atomically(target, data)
        return rel

    def write_text(self, name: str, text: str | Iterable[str | bytes]) -> str:
        if isinstance(text, str):
            return self.write_bytes(name, text.encode("utf-8"))
        # pieces already encoded (numpy-formatted arrays) pass through as they are
        return self.write_bytes(name, (piece if isinstance(piece, bytes)
                                       else piece.encode("utf-8") for piece in text))

    def adopt(self, names: list[str]) -> None:
        """List files a build step made in the folder (after cclc wrote their sources), so a
        later run may replace them; names that do not exist are left out."""
        with self:
            new = {rel for rel in map(self._normalize, names)
                   if rel not in self._files and (self.path / rel).is_file()}
            if new:
                self._files |= new
                self._save_manifest()

    def refuse_foreign(self, names: list[str]) -> None:
        """:class:`~cclc.errors.CclError` naming every file of ``names`` that exists and cclc
        did not write (unless ``force``): checked before any work, so a refused run leaves
        no part of its output behind (the writes themselves refuse too)."""
        if self.force:
            return
        foreign = [n for n in dict.fromkeys(names)
                   if self.path_for(n).exists() and not self.owns(n)]
        if foreign:
            raise CclError(f"refusing to overwrite {', '.join(map(repr, foreign))} in "
                           f"'{self.path}': cclc did not write them (use --force to replace "
                           "them)")

    def _save_manifest(self) -> None:
        # another OutputDir on the same folder (a backend's) may have listed files since we
        # read the manifest: keep them
        self._files |= self._read_manifest()
        doc = {"format": _FORMAT, "version": _VERSION, "files": sorted(self._files)}
        write_atomically(self.path / MANIFEST, (json.dumps(doc, indent=1) + "\n").encode("utf-8"))


class _FolderLock:
    """The lock file of one output folder, open and locked (:func:`fcntl.flock`)."""

    def __init__(self, path: Path, fd: int):
        self.path = path
        self.fd = fd

    @classmethod
    def acquire(cls, folder: Path) -> _FolderLock:
        """Lock ``folder`` or raise :class:`~cclc.errors.CclError` naming the holder."""
        path = folder / LOCK
        while True:
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
            except OSError as err:
                raise CclError(f"cannot lock the output folder '{folder}': "
                               f"{err.strerror or err}") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as err:
                holder = _read_pid(fd)
                os.close(fd)
                if err.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    by = f" (process {holder})" if holder else ""
                    raise CclError(f"the output folder '{folder}' is being written by another "
                                   f"cclc run{by}; wait for it to finish or choose another "
                                   "folder") from None
                raise CclError(f"cannot lock the output folder '{folder}': "
                               f"{err.strerror or err}") from None
            # the holder before us may have removed the file between our open and our lock:
            # then we locked a file nobody else will see; lock the one at the path instead
            if _same_file(fd, path):
                break
            os.close(fd)
        if os.fstat(fd).st_size and not _read_pid(fd):
            # not a lock file cclc made (cclc's hold a process id): never truncate the user's
            os.close(fd)
            raise CclError(f"'{path}' is not cclc's lock file; move it away to write into "
                           f"'{folder}'")
        try:
            # who holds it, for the message of a refused run; the lock works without it
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
        except OSError:
            pass
        return cls(path, fd)

    def release(self) -> None:
        # removed while still locked, so a run that opens it later locks a new file
        try:
            os.unlink(self.path)
        except OSError:
            pass
        os.close(self.fd)


def _same_file(fd: int, path: Path) -> bool:
    """Whether the open ``fd`` is the file at ``path`` now."""
    try:
        at_path = os.stat(path)
    except OSError:
        return False
    held = os.fstat(fd)
    return (held.st_dev, held.st_ino) == (at_path.st_dev, at_path.st_ino)


def _read_pid(fd: int) -> str:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return ""
    return text if text.isdigit() else ""


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_file(path: str | os.PathLike, data: bytes | Iterable[bytes], force: bool = False
               ) -> Path:
    """Write one file the user named through the :class:`OutputDir` of its folder: atomically,
    listed in that folder's manifest, under its lock, and refused (unless ``force``) when the
    file exists and cclc did not write it; returns its path.

    >>> import tempfile
    >>> page = write_file(Path(tempfile.mkdtemp()) / "page.html", b"<!doctype html>")
    >>> OutputDir(page.parent).files()
    ('page.html',)
    """
    target = Path(path)
    if target.name in ("", ".", ".."):
        raise CclError(f"'{os.fspath(path)}' names a folder, not a file")
    with OutputDir(target.parent, force=force) as out:
        out.write_bytes(target.name, data)
    return target


def write_atomically(target: str | os.PathLike, data: bytes | Iterable[bytes]) -> None:
    """Write ``data`` to ``target`` through a temporary file beside it moved into place, so
    a reader (or a second writer) never sees half a file; :class:`~cclc.errors.CclError` when
    the file system refuses. The step under :class:`OutputDir`'s writes: cclc's own files go
    through :class:`OutputDir` (or :func:`write_file`), never here directly."""
    target = Path(target)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                if isinstance(data, bytes):
                    f.write(data)
                else:
                    f.writelines(data)
            # mkstemp makes the file private; give it the mode a plain open() would
            os.chmod(tmp, 0o666 & ~_umask())
            os.replace(tmp, target)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
    except OSError as err:
        raise CclError(f"cannot write '{target}': {err.strerror or err}") from None
