#!/usr/bin/env bash
# Install cni-dra on this node, idempotently. Called by the Makefile:
#
#   scripts/install.sh deps      apt packages (iproute2, reference CNI plugins, venv, Go, libcni source, C compiler, iperf3,
#                                and the shell linter make lint runs)
#   scripts/install.sh venv      /opt/cni-dra/venv from Debian's /usr/bin/python3 + runtime and test deps
#                                (the tests' Python, and where the tree takes cni-dra's dependencies from)
#   scripts/install.sh package   the project, non-editable, into the venv
#   scripts/install.sh tree      the plugin tree (scripts/image/tree.py: cni-dra with its own
#                                Python and libraries) as /opt/cni/bin/cni-dra.d, and the
#                                compiled client that runs it as /opt/cni/bin/cni-dra
#   scripts/install.sh plugins   reference plugins from /usr/lib/cni reachable on CNI_PATH=/opt/cni/bin
#   scripts/install.sh units     the agent's systemd units (conf/systemd) into /etc/systemd/system
#                                (CNI_DRA_SYSTEMD_DIR), ExecStart naming $CNI_BIN_DIR/cni-dra;
#                                nothing is enabled or started
#   scripts/install.sh all       all of the above, in that order
#
# Each step records what it did in a stamp file inside the venv (so that removing
# the venv forgets them) and skips itself when nothing it depends on changed.
# A second run with nothing changed takes well under a second.
set -euo pipefail

PREFIX=${CNI_DRA_PREFIX:-/opt/cni-dra}
VENV=${CNI_DRA_VENV:-$PREFIX/venv}
CNI_BIN_DIR=${CNI_BIN_DIR:-/opt/cni/bin}
REF_PLUGIN_DIR=${CNI_REF_PLUGIN_DIR:-/usr/lib/cni}
SYSTEMD_DIR=${CNI_DRA_SYSTEMD_DIR:-/etc/systemd/system}
SYSTEM_PYTHON=/usr/bin/python3
APT_PACKAGES=(iproute2 containernetworking-plugins python3-venv golang-go golang-github-appc-cni-dev gcc libc6-dev iperf3 shellcheck)

SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export DEBIAN_FRONTEND=noninteractive PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1

BUILD_TMP=
trap '[[ -n $BUILD_TMP ]] && rm -rf "$BUILD_TMP"' EXIT

say() { printf 'install: %s\n' "$*" >&2; }

stamp_file() { printf '%s/.cni-dra-%s.stamp' "$VENV" "$1"; }
stamp_ok() { [[ -f $(stamp_file "$1") && "$(cat "$(stamp_file "$1")")" == "$2" ]]; }
stamp_set() { printf '%s' "$2" >"$(stamp_file "$1")"; }

# sha256 over the names and contents of the given files (sorted), one line.
hash_files() {
    local f
    for f in $(printf '%s\n' "$@" | LC_ALL=C sort); do
        printf '%s ' "$f"
        sha256sum <"$SRC/$f"
    done | sha256sum | cut -d' ' -f1
}

package_sources() {
    (cd "$SRC" && find cni_dra -name __pycache__ -prune -o -type f ! -name '*.pyc' -print
     echo pyproject.toml; echo setup.py; echo README.md; echo scripts/cni-dra-entry.py; echo scripts/cni-dra-client.c
     echo scripts/install.sh; echo scripts/image/tree.py; echo scripts/image/pysource.py; echo scripts/image/elf.py)
}

missing_apt_packages() {
    local p
    for p in "${APT_PACKAGES[@]}"; do
        if [[ "$(dpkg-query -W -f='${db:Status-Abbrev}' "$p" 2>/dev/null)" != ii* ]]; then
            printf '%s\n' "$p"
        fi
    done
}

do_deps() {
    local missing
    missing=$(missing_apt_packages)
    if [[ -z $missing ]]; then
        return 0
    fi
    # shellcheck disable=SC2086
    say "apt packages missing: "$missing
    # apt-get update only when needed: no package lists at all, or the install fails
    # (stale lists pointing at files the mirror no longer has).
    if ! compgen -G '/var/lib/apt/lists/*_Packages*' >/dev/null; then
        apt-get update -qq
    fi
    # shellcheck disable=SC2086
    if ! apt-get install -y -qq --no-install-recommends $missing </dev/null; then
        apt-get update -qq
        # shellcheck disable=SC2086
        apt-get install -y -qq --no-install-recommends $missing </dev/null
    fi
}

# Requirements (runtime + test extra + build backend) from pyproject.toml, one per line.
requirements() {
    "$SYSTEM_PYTHON" - "$SRC/pyproject.toml" <<'EOF'
import sys, tomllib
with open(sys.argv[1], "rb") as f:
    data = tomllib.load(f)
reqs = list(data["build-system"]["requires"])
reqs += data["project"].get("dependencies", [])
name = data["project"]["name"]
for extra in data["project"].get("optional-dependencies", {}).values():
    reqs += [r for r in extra if r.split("[")[0].strip() != name]  # "dev" names the others
print("\n".join(dict.fromkeys(reqs)))
EOF
}

venv_is_debian() {
    [[ -x $VENV/bin/python ]] &&
        [[ "$("$VENV/bin/python" -c 'import sys; print(sys.base_prefix)' 2>/dev/null)" == /usr ]]
}

do_venv() {
    if ! venv_is_debian; then
        say "creating $VENV from $SYSTEM_PYTHON"
        rm -rf "$VENV"
        mkdir -p "$(dirname "$VENV")"
        "$SYSTEM_PYTHON" -m venv "$VENV"
    fi
    local want
    want=$(requirements | sha256sum | cut -d' ' -f1)
    if stamp_ok venv "$want"; then
        return 0
    fi
    say "installing dependencies into $VENV"
    local reqs
    mapfile -t reqs < <(requirements)
    "$VENV/bin/python" -m pip install -q "${reqs[@]}"
    stamp_set venv "$want"
}

# The plugin executable: scripts/cni-dra-client.c compiled, statically, into $1. It runs
# the plugin tree beside it (cni-dra.d) when the agent does not answer.
build_client() {
    local out=$1
    if ! command -v cc >/dev/null; then
        say "no C compiler (cc): the plugin is a compiled client; install gcc and libc6-dev (make deps)"
        exit 1
    fi
    cc -O2 -static -Wall -Wextra -Werror -o "$out" "$SRC/scripts/cni-dra-client.c"
}

# The plugin tree at $CNI_BIN_DIR/cni-dra.d, built beside it then swapped in by two renames;
# the tree it replaces stays as .cni-dra.d.old until the next install (an invocation that
# started with it can finish).
install_tree() {
    local tree=$CNI_BIN_DIR/cni-dra.d new=$CNI_BIN_DIR/.cni-dra.d.new old=$CNI_BIN_DIR/.cni-dra.d.old
    rm -rf "$new"
    "$VENV/bin/python" "$SRC/scripts/image/tree.py" --venv "$VENV" --out "$new"
    rm -rf "$old"
    if [[ -d $tree ]]; then
        mv "$tree" "$old"
    fi
    mv "$new" "$tree"
}

do_package() {
    local want files
    mapfile -t files < <(package_sources)
    want=$( (echo "$VENV"; hash_files "${files[@]}") | sha256sum | cut -d' ' -f1)
    if stamp_ok package "$want"; then
        return 0
    fi
    say "installing cni-dra (non-editable) into $VENV"
    # Build from a clean copy so that a stale build/ or *.egg-info in the work tree
    # can never put removed modules into the wheel.
    BUILD_TMP=$(mktemp -d)
    local tmp=$BUILD_TMP
    (cd "$SRC" && tar -cf - --exclude=__pycache__ --exclude='*.pyc' "${files[@]}") | tar -xf - -C "$tmp"
    "$VENV/bin/python" -m pip install -q --no-deps --no-build-isolation --force-reinstall "$tmp"
    rm -rf "$tmp"
    stamp_set package "$want"
}

do_tree() {
    local want files
    mapfile -t files < <(package_sources)
    want=$( (echo "$VENV $CNI_BIN_DIR"; hash_files "${files[@]}") | sha256sum | cut -d' ' -f1)
    if stamp_ok tree "$want" && [[ -x $CNI_BIN_DIR/cni-dra && -x $CNI_BIN_DIR/cni-dra.d/bin/python3 ]]; then
        return 0
    fi
    mkdir -p "$CNI_BIN_DIR"
    say "building the plugin tree $CNI_BIN_DIR/cni-dra.d"
    install_tree
    # Write then rename: a runtime may exec the plugin while we replace it.
    build_client "$CNI_BIN_DIR/.cni-dra.tmp"
    chmod 0755 "$CNI_BIN_DIR/.cni-dra.tmp"
    mv -f "$CNI_BIN_DIR/.cni-dra.tmp" "$CNI_BIN_DIR/cni-dra"
    rm -f "$VENV/libexec/cni-dra"  # the Python executable of the venv-based layout before the tree
    say "$CNI_BIN_DIR/cni-dra: compiled client; runs $CNI_BIN_DIR/cni-dra.d when the agent does not serve"
    stamp_set tree "$want"
}

do_plugins() {
    mkdir -p "$CNI_BIN_DIR"
    local src name
    for src in "$REF_PLUGIN_DIR"/*; do
        [[ -f $src && -x $src ]] || continue
        name=$(basename "$src")
        # Never clobber: a file (or link) already there was put by someone else.
        if [[ ! -e $CNI_BIN_DIR/$name && ! -L $CNI_BIN_DIR/$name ]]; then
            ln -s "$src" "$CNI_BIN_DIR/$name"
        fi
    done
}

# The units name /opt/cni/bin/cni-dra; another CNI_BIN_DIR is written into ExecStart. Each
# file is written beside its place then renamed over it. Enabling is the operator's step
# (systemctl enable --now cni-dra-agent.socket): a node with Kubernetes runs the agent
# from the DaemonSet instead.
do_units() {
    local src name tmp
    mkdir -p "$SYSTEMD_DIR"
    for src in "$SRC"/conf/systemd/*.socket "$SRC"/conf/systemd/*.service; do
        name=$(basename "$src")
        tmp=$SYSTEMD_DIR/.$name.tmp
        sed "s#^ExecStart=/opt/cni/bin/cni-dra #ExecStart=$CNI_BIN_DIR/cni-dra #" "$src" >"$tmp"
        chmod 0644 "$tmp"
        if cmp -s "$tmp" "$SYSTEMD_DIR/$name"; then
            rm -f "$tmp"
        else
            mv -f "$tmp" "$SYSTEMD_DIR/$name"
            say "$SYSTEMD_DIR/$name (enable with: systemctl enable --now cni-dra-agent.socket)"
        fi
    done
}

main() {
    if [[ $(id -u) -ne 0 ]]; then
        say "must run as root"
        exit 1
    fi
    local step
    for step in "$@"; do
        case $step in
        deps) do_deps ;;
        venv) do_venv ;;
        package) do_package ;;
        tree) do_tree ;;
        plugins) do_plugins ;;
        units) do_units ;;
        all) do_deps; do_venv; do_package; do_tree; do_plugins; do_units ;;
        *) say "unknown step: $step"; exit 2 ;;
        esac
    done
}

main "${@:-all}"
