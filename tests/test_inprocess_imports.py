"""What an in-process invocation imports (the Python executable when the agent does not serve).

Without the agent every invocation pays its imports in a fresh interpreter, so their
structure is guarded here, not their time: the in-process plugin imports neither the
operator CLI's libraries (click, kubernetes, grpc) nor ``importlib.metadata`` (pydantic's
plugin discovery), pyroute2 is loaded without running its package ``__init__`` (which
imports every pyroute2 API), the Kubernetes API models it does not validate are not
built, and the ResourceClaim's (cni_dra.dra.claims) not defined. pyroute2's asyncio ``IPRoute`` (``pyroute2.iproute``, ``pyroute2.netlink.nlsocket``,
asyncio itself) is not imported: the netlink layer sends pyroute2's messages on its own
blocking socket, and imports tc's message modules only when it shapes. No model makes
pydantic tokenize a builtin's text signature (cni_dra.fields).
netns_tests/test_inprocess_imports.py checks the same on a real ADD and DEL of the
installed tree.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BASE_ENV = {"PATH": "/usr/bin:/bin"}

# Imported only by what the in-process plugin does not do.
FORBIDDEN = ("click", "kubernetes", "grpc", "importlib.metadata")
# What pyroute2's package __init__ imports and cni-dra's netlink layer does not use.
PYROUTE2_UNUSED = ("pyroute2.ndb", "pyroute2.ipdb", "pyroute2.conntrack", "pyroute2.plan9", "pyroute2.ipset")
# pyroute2's asyncio engine (IPRoute and its socket), replaced by cni_dra.netlink._rtnl.
ASYNC_ENGINE = ("asyncio", "pyroute2.iproute", "pyroute2.netlink.nlsocket", "pyroute2.netlink.rtnl.iprsocket")
# tc's message and its plugins: imported on the first tc request only.
TC_MODULES = ("pyroute2.netlink.rtnl.tcmsg", "pyroute2.requests.tc")
# What an ADD loads on first use and an in-process DEL does without; the agent's warm-up loads them.
FIRST_USE = ("cni_dra.allocator.capacity", "cni_dra.allocator.select", "cni_dra.protocol.results")


def _fresh(code: str, env: dict[str, str] | None = None, stdin: bytes = b"") -> dict[str, object]:
    """Run ``code`` in a fresh ``python -IS`` with the work tree first on ``sys.path`` and
    ``site`` loaded as the executable loads it; ``code`` sets ``out``, printed as JSON."""
    prelude = f"import json, sys\nsys.path.insert(0, {str(ROOT)!r})\n"
    epilogue = "\nsys.stdout.write('\\n' + json.dumps(out))\n"
    proc = subprocess.run(
        [sys.executable, "-IS", "-c", prelude + code + epilogue],
        input=stdin,
        env={**BASE_ENV, **(env or {})},
        capture_output=True,
        timeout=120,
        check=False,
        cwd="/",
    )
    assert proc.returncode == 0, proc.stderr.decode()
    return json.loads(proc.stdout.decode().rsplit("\n", 1)[1])  # type: ignore[no-any-return]


def test_pyroute2_loads_without_its_package_init():
    """The netlink layer's messages and request filters load without what pyroute2/__init__
    imports, and without the asyncio engine; tc's modules come with the first tc request
    (``from pyroute2 import protocols`` in them imports the submodule, the package's
    ``__init__`` still not run); that ``__init__`` runs when something asks the package for
    more, and the package is then the real one, with the very classes the layer uses."""
    out = _fresh(
        "import site; site.main()\n"
        "from cni_dra.netlink import _pyroute2, _rtnl\n"
        "nl = _pyroute2.load()\n"
        "base = _rtnl._base()\n"
        "loaded = sorted(sys.modules)\n"
        "tc = _rtnl._tc()\n"
        "with_tc = sorted(sys.modules)\n"
        "ran = 'IPRoute' in vars(sys.modules['pyroute2'])\n"
        "import pyroute2, pyroute2.netlink\n"
        "from pyroute2 import NDB\n"
        "out = {'loaded': loaded, 'with_tc': with_tc, 'ran': ran, 'after': sorted(sys.modules), 'same': ["
        "pyroute2.NetlinkError is nl.NetlinkError, pyroute2.netlink.nla is not None,"
        " pyroute2.netlink.rtnl.ifinfmsg.ifinfmsg is base.ifinfmsg,"
        " pyroute2.netlink.rtnl.tcmsg.tcmsg is tc.tcmsg,"
        " isinstance(pyroute2.__version__, str), NDB is pyroute2.ndb.main.NDB]}\n"
    )
    loaded, with_tc, after = out["loaded"], out["with_tc"], out["after"]
    assert isinstance(loaded, list) and isinstance(with_tc, list) and isinstance(after, list)
    messages = {"pyroute2.netlink.rtnl.ifinfmsg", "pyroute2.requests.link", "pyroute2.netlink.rtnl.rtmsg"}
    assert messages <= set(loaded)
    assert [m for m in loaded if m.startswith(PYROUTE2_UNUSED + ASYNC_ENGINE + TC_MODULES)] == []
    assert set(TC_MODULES) <= set(with_tc) and out["ran"] is False
    assert [m for m in with_tc if m.startswith(PYROUTE2_UNUSED + ASYNC_ENGINE)] == []
    assert "pyroute2.ndb.main" in after  # asked for more: the package's __init__ ran
    assert out["same"] == [True] * 6


def test_pyroute2_submodules_import_directly_while_the_package_init_is_deferred():
    """A submodule imported by name after the layer loaded pyroute2 (the test beds'
    ``from pyroute2.iproute.linux import IPRoute``) loads without running the package's
    ``__init__`` half-way (its ``from pyroute2 import netns`` gets the submodule)."""
    out = _fresh(
        "import site; site.main()\n"
        "from cni_dra.netlink import _rtnl\n"
        "_rtnl._base()\n"
        "from pyroute2.iproute.linux import IPRoute\n"
        "ran = 'IPRoute' in vars(sys.modules['pyroute2'])\n"
        "import pyroute2\n"
        "out = [ran, pyroute2.IPRoute is IPRoute]\n"
    )
    assert out == [False, True]


def test_pyroute2_package_completes_once_under_concurrent_first_use():
    out = _fresh(
        "import site, threading; site.main()\n"
        "from cni_dra.netlink import _pyroute2\n"
        "nl = _pyroute2.load()\n"
        "pkg = sys.modules['pyroute2']\n"
        "got = []\n"
        "threads = [threading.Thread(target=lambda: got.append(pkg.NetlinkError is nl.NetlinkError)) for _ in range(8)]\n"
        "[t.start() for t in threads]; [t.join() for t in threads]\n"
        "out = got\n"
    )
    assert out == [True] * 8


def test_pyroute2_already_imported_is_used_as_it_is():
    out = _fresh(
        "import site; site.main()\n"
        "import pyroute2\n"
        "from cni_dra.netlink import _pyroute2\n"
        "out = [sys.modules['pyroute2'] is pyroute2, _pyroute2.load().NetlinkError is pyroute2.NetlinkError]\n"
    )
    assert out == [True, True]


@pytest.mark.parametrize("command", ["ADD", "DEL"])
def test_an_in_process_invocation_imports_no_cli_library_nor_importlib_metadata(tmp_path, command):
    """The whole in-process path of the executable (``cni_dra.main.main``, config parsed,
    state and verb modules imported, the verb run until it needs the pod's namespace), then
    the netlink layer's pyroute2 as its first netlink call loads it."""
    conf = {
        "cniVersion": "1.1.0",
        "name": "n",
        "type": "cni-dra",
        "stateDir": str(tmp_path / "state"),
        "inventory": str(tmp_path / "slice.json"),
        "ipam": {
            "type": "host-local",
            "dataDir": str(tmp_path / "ipam"),
            "ranges": [[{"subnet": "10.9.0.0/24"}]],
        },
    }
    env = {
        "CNI_COMMAND": command,
        "CNI_DRA_AGENT": "off",
        "CNI_CONTAINERID": "c1",
        "CNI_NETNS": str(tmp_path / "no-such-netns"),
        "CNI_IFNAME": "eth0",
        "CNI_PATH": str(tmp_path / "no-plugins"),
    }
    out = _fresh(
        "import cni_dra.main\n"
        "import gc\n"
        "code = cni_dra.main.main()\n"
        "collecting = gc.isenabled()\n"
        "from cni_dra.netlink import _rtnl\n"
        "_rtnl._base()\n"
        "import pydantic, cni_dra.dra.objects as o\n"
        "built = [n for n, c in vars(o).items() if isinstance(c, type) and issubclass(c, pydantic.BaseModel)"
        " and c.__pydantic_complete__]\n"
        "claims = 'cni_dra.dra.claims' in sys.modules\n"
        "import tokenize\n"
        "tokenized = tokenize._compile.cache_info().currsize\n"
        "out = {'code': code, 'modules': sorted(sys.modules), 'built': built, 'collecting': collecting,"
        " 'tokenized': tokenized, 'claims': claims}\n",
        env,
        json.dumps(conf).encode(),
    )
    modules = out["modules"]
    assert isinstance(modules, list)
    # it went through the in-process plugin (not vacuous): config models, state, the verb
    went = {"cni_dra.cni", "cni_dra.protocol.config", "pydantic", "pyroute2.netlink.rtnl.ifinfmsg"}
    assert went <= set(modules)
    assert f"cni_dra.verbs.{'add' if command == 'ADD' else 'delete'}" in modules
    assert [m for m in modules if m.split(".")[0] in FORBIDDEN or m.startswith(FORBIDDEN)] == []
    assert [m for m in modules if m.startswith(PYROUTE2_UNUSED + ASYNC_ENGINE)] == []
    # the Kubernetes API models of claims (the agent's, the CLI's) are not even defined, and
    # the ResourceSlice's models are built only when an inventory is validated
    assert out["claims"] is False
    assert "ObjectMeta" not in out["built"] and "ResourceSlice" not in out["built"]
    # a one-invocation process: the cyclic garbage collector does not walk what it imports
    assert out["collecting"] is False
    # no builtin's text signature parsed (pydantic's look at list default factories,
    # cni_dra.fields): the tokenizer's regular expressions were never compiled
    assert out["tokenized"] == 0


def test_the_agents_warm_up_loads_tc_so_its_first_shaped_add_does_not():
    """A plugin run imports tc's messages on its first tc request; a long-lived process (the
    agent and its worker processes) loads them when it warms up, with what only an ADD needs."""
    out = _fresh(
        "import site; site.main()\n"
        "from cni_dra.fastpath.warm import warm_imports\n"
        f"before = [m in sys.modules for m in {TC_MODULES + FIRST_USE!r}]\n"
        "warm_imports()\n"
        f"out = [before, [m in sys.modules for m in {TC_MODULES + FIRST_USE!r}]]\n"
    )
    assert out == [[False] * 5, [True] * 5]


def test_the_agents_warm_up_has_the_books_counted_at_the_first_question():
    """A serving process asks the books at every ADD (cni_dra.state.books.serving); a plugin
    run in-process, which asks once, does not turn that on."""
    out = _fresh(
        "import site; site.main()\n"
        "from cni_dra.state import books\n"
        "import cni_dra.main\n"
        "before = books._serving\n"
        "from cni_dra.fastpath.warm import warm_imports\n"
        "warm_imports()\n"
        "out = [before, books._serving]\n"
    )
    assert out == [False, True]
