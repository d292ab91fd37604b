"""The compiled client's wire constants are those of :mod:`cni_dra.fastpath.wire`, and its
plugin tree paths those of the tree's builder (scripts/image/tree.py).

scripts/cni-dra-client.c repeats the wire format's constants and the tree's layout as
``#define`` s. This test compiles a small program that includes that file (its ``main``
renamed) and prints every one of them as the compiler sees it, then compares each with the
module: a change on one side only fails here, not on a node.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cni_dra.fastpath import wire
from cni_dra.protocol.config import MAX_CONFIG_BYTES

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "scripts" / "cni-dra-client.c"
CC = shutil.which("cc")

pytestmark = pytest.mark.skipif(CC is None, reason="no C compiler (cc) to build scripts/cni-dra-client.c")

# name in the C file -> (printf conversion, value in wire.py)
STRINGS = {
    "MAGIC": wire.MAGIC,
    "STATUS_OK": wire.STATUS_OK,
    "STATUS_DECLINED": wire.STATUS_DECLINED,
    "DEFAULT_SOCKET": wire.DEFAULT_SOCKET.encode(),
    "ENV_MODE": wire.ENV_MODE.encode(),
    "ENV_SOCKET": wire.ENV_SOCKET.encode(),
    "ENV_TIMEOUT": wire.ENV_TIMEOUT.encode(),
    "ENV_ASKED": wire.ENV_ASKED.encode(),
}


def _tree_module():  # type: ignore[no-untyped-def]
    """scripts/image/tree.py (not a package: loaded from its file)."""
    path = ROOT / "scripts" / "image" / "tree.py"
    spec = importlib.util.spec_from_file_location("cni_dra_image_tree", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(path.parent))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(path.parent))
    return module


_TREE = _tree_module()
# name in the C file -> the path in the tree the builder writes
TREE = {
    "TREE_NAME": _TREE.TREE_NAME.encode(),
    "TREE_LOADER": b"/" + _TREE.LOADER.encode(),
    "TREE_LIBS": b"/" + _TREE.LOADER.rsplit("/", 1)[0].encode(),
    "TREE_PYTHON": b"/" + _TREE.PYTHON.encode(),
    "TREE_ENTRY": b"/" + _TREE.ENTRY.encode(),
}
NUMBERS = {
    "WIRE_VERSION": wire.VERSION,
    "MAGIC_LEN": len(wire.MAGIC),
    "FRAME_HEADER_BYTES": wire.FRAME_HEADER_BYTES,
    "REQUEST_FRAMES": wire.REQUEST_FRAMES,
    "RESPONSE_FRAMES": wire.RESPONSE_FRAMES,
    "MAX_MESSAGE_BYTES": wire.MAX_MESSAGE_BYTES,
    "STDIN_LIMIT_BYTES": wire.STDIN_LIMIT_BYTES,
    "DEFAULT_TIMEOUT_S": wire.DEFAULT_TIMEOUT_S,
    "CONNECT_TIMEOUT_S": wire.CONNECT_TIMEOUT_S,
}


@pytest.fixture(scope="module")
def c_constants(tmp_path_factory) -> dict[str, object]:
    """Every constant of :data:`STRINGS`, :data:`TREE` and :data:`NUMBERS` as the C compiler evaluates it."""
    d = tmp_path_factory.mktemp("wire")
    lines = [
        "#define main cni_dra_client_main",
        f'#include "{SOURCE}"',
        "#undef main",
        "static void hex(const char *name, const char *s, size_t n) {",
        '    printf("\\"%s\\": \\"", name);',
        '    for (size_t i = 0; i < n; i++) printf("%02x", (unsigned char)s[i]);',
        '    printf("\\",\\n");',
        "}",
        "int main(void) {",
        '    printf("{\\n");',
    ]
    lines += [f'    hex("{name}", {name}, sizeof {name} - 1);' for name in [*STRINGS, *TREE]]
    lines += [f'    printf("\\"{name}\\": %.17g,\\n", (double)({name}));' for name in NUMBERS]
    lines += ['    printf("\\"end\\": 0}\\n");', "    return 0;", "}"]
    (d / "print.c").write_text("\n".join(lines) + "\n")
    subprocess.run(
        [
            CC,
            "-O0",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-Wno-unused-function",
            "-o",
            str(d / "print"),
            str(d / "print.c"),
        ],
        check=True,
        capture_output=True,
    )
    out = subprocess.run([str(d / "print")], check=True, capture_output=True, text=True).stdout
    return json.loads(out)


@pytest.mark.parametrize("name", STRINGS)
def test_string_constants_match_the_wire_module(c_constants, name):
    assert bytes.fromhex(str(c_constants[name])) == STRINGS[name]


@pytest.mark.parametrize("name", TREE)
def test_tree_paths_match_the_tree_builder(c_constants, name):
    assert bytes.fromhex(str(c_constants[name])) == TREE[name]


@pytest.mark.parametrize("name", NUMBERS)
def test_numeric_constants_match_the_wire_module(c_constants, name):
    assert c_constants[name] == NUMBERS[name]


def test_the_stdin_limit_is_one_byte_past_the_largest_config():
    assert wire.STDIN_LIMIT_BYTES == MAX_CONFIG_BYTES + 1


def test_the_magic_carries_the_version():
    assert wire.MAGIC == f"CNIDRA-FP{wire.VERSION}\n".encode()


def test_every_wire_name_the_c_file_uses_is_checked():
    """Each ``#define`` of the C file (wire.py's, the tree's) is in the tables above."""
    defined = {
        line.split()[1].split("(")[0]
        for line in SOURCE.read_text().splitlines()
        if line.startswith("#define ")
    }
    helpers = {"_GNU_SOURCE", "STR_", "STR"}  # feature macro; stringification
    assert defined - helpers == set(STRINGS) | set(NUMBERS) | set(TREE)
