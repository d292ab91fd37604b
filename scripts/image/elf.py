"""What an ELF file asks of the dynamic loader: its ``DT_NEEDED`` sonames and its search
path (``DT_RUNPATH``, else ``DT_RPATH``), read from the file (x86-64: ELF64, little endian).

The plugin tree (scripts/image/tree.py) uses it to bring along every shared library its
interpreter and extension modules load, and to prove nothing is left to the host.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Dynamic", "is_elf", "read_dynamic"]

_PT_LOAD, _PT_DYNAMIC = 1, 2
_DT_NULL, _DT_NEEDED, _DT_STRTAB, _DT_RPATH, _DT_RUNPATH = 0, 1, 5, 15, 29


@dataclass(frozen=True)
class Dynamic:
    """``needed``: sonames in file order; ``search``: the raw RUNPATH (or RPATH) entries,
    ``$ORIGIN`` not expanded; both empty for a static executable."""

    needed: tuple[str, ...]
    search: tuple[str, ...]


def is_elf(path: Path) -> bool:
    """The file starts with the ELF magic."""
    with open(path, "rb") as f:
        return f.read(4) == b"\x7fELF"


def read_dynamic(path: Path) -> Dynamic:
    """The dynamic section of ``path``. Raises ValueError for anything but a little-endian
    ELF64 file or a malformed one."""
    data = path.read_bytes()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError(f"{path}: not a little-endian ELF64 file")
    (phoff,) = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    loads, dynamic = [], None
    for i in range(phnum):
        p_type, _, p_offset, p_vaddr, _, p_filesz = struct.unpack_from("<IIQQQQ", data, phoff + i * phentsize)
        if p_type == _PT_LOAD:
            loads.append((p_vaddr, p_offset, p_filesz))
        elif p_type == _PT_DYNAMIC:
            dynamic = (p_offset, p_filesz)
    if dynamic is None:
        return Dynamic((), ())
    entries = []
    for off in range(dynamic[0], dynamic[0] + dynamic[1], 16):
        tag, val = struct.unpack_from("<qQ", data, off)
        if tag == _DT_NULL:
            break
        entries.append((tag, val))
    strtab = next((val for tag, val in entries if tag == _DT_STRTAB), None)
    if strtab is None:
        raise ValueError(f"{path}: dynamic section without a string table")
    base = _file_offset(loads, strtab, path)

    def string(offset: int) -> str:
        end = data.index(b"\0", base + offset)
        return data[base + offset : end].decode()

    needed = tuple(string(val) for tag, val in entries if tag == _DT_NEEDED)
    runpath = [string(val) for tag, val in entries if tag == _DT_RUNPATH]
    rpath = [string(val) for tag, val in entries if tag == _DT_RPATH]
    search = ":".join(runpath or rpath)
    return Dynamic(needed, tuple(p for p in search.split(":") if p))


def _file_offset(loads: list[tuple[int, int, int]], vaddr: int, path: Path) -> int:
    for p_vaddr, p_offset, p_filesz in loads:
        if p_vaddr <= vaddr < p_vaddr + p_filesz:
            return vaddr - p_vaddr + p_offset
    raise ValueError(f"{path}: address {vaddr:#x} in no loaded segment")
