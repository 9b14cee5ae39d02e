"""Writing into an output folder without clobbering the user's files.

cclc records every file it writes in a manifest, ``.cclc-manifest.json``, in the folder. A file
cclc wrote before may be replaced; any other existing file is refused unless ``force`` is set,
so ``cclc compile -o .`` cannot silently overwrite a source file. Each file is written to a
temporary file beside it and moved into place with :func:`os.replace`, so a reader (or a crash)
never sees half a file.

>>> import tempfile
>>> out = OutputDir(tempfile.mkdtemp())
>>> out.write_text("a.json", "{}")
'a.json'
>>> out.files()
('a.json',)
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path, PurePosixPath

from cclc.errors import CclError

__all__ = ["MANIFEST", "OutputDir"]

#: the manifest's file name inside an output folder
MANIFEST = ".cclc-manifest.json"
_FORMAT = "cclc-manifest"
_VERSION = 1


class OutputDir:
    """An output folder (created if missing) that cclc writes files into.

    ``force`` allows replacing files cclc did not write. Names are relative POSIX paths inside
    the folder (``"nccl/a2a.cu"``); sub-folders are created as needed.
    """

    def __init__(self, path: str | os.PathLike, force: bool = False):
        self.path = Path(path)
        self.force = force
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
        if p.is_absolute() or not p.parts or ".." in p.parts or p.name == MANIFEST:
            raise CclError(f"'{name}' is not a file name inside the output folder")
        return p.as_posix()

    def path_for(self, name: str) -> Path:
        """Where ``name`` lands (checked to stay inside the folder)."""
        return self.path / self._normalize(name)

    def write_bytes(self, name: str, data: bytes | Iterable[bytes]) -> str:
        """Write ``data`` (or its pieces, as they come) to ``name`` atomically; returns the
        normalized name.

        :class:`~cclc.errors.CclError` if ``name`` exists and cclc did not write it (unless
        ``force``), or when the file system refuses.
        """
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
        _atomic_write(target, data)
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
        _atomic_write(self.path / MANIFEST, (json.dumps(doc, indent=1) + "\n").encode("utf-8"))


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _atomic_write(target: Path, data: bytes | Iterable[bytes]) -> None:
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
