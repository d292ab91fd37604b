# shellcheck shell=bash
# Sourced by scripts/e2e/build-helm, build-crio and build-multus: what they share for
# building one release of a Go project from the Go module proxy into a cache directory
# keyed by version, with a stamp, a lock and timed phases (as scripts/e2e/build-kube does).
#
# The caller sets, before sourcing:
#   tool         its name, the prefix of every log line (stderr)
# and gets:
#   cache_root   $CNI_DRA_E2E_CACHE, default /var/cache/cni-dra-e2e
#   log, die, phase, cache_lock, mod_fetch (below)
# Environment read here:
#   GOFLAGS               passed through to go (e.g. GOFLAGS=-p=2)
#   CNI_DRA_BUILD_TIME_V  set to 1 to time each phase with `/usr/bin/time -v`
#                         (default: a one-line summary of wall, CPU and max RSS)

: "${tool:?set tool before sourcing build-lib.sh}"
cache_root=${CNI_DRA_E2E_CACHE:-/var/cache/cni-dra-e2e}

log() { printf '%s: %s\n' "$tool" "$*" >&2; }
die() { log "error: $*"; exit 1; }

# phase NAME COMMAND...: run one phase, with its wall time, CPU time and peak memory
# on stderr.
phase() {
    local name=$1
    shift
    log "phase $name: $*"
    if [[ -x /usr/bin/time && ${CNI_DRA_BUILD_TIME_V:-0} == 1 ]]; then
        /usr/bin/time -v "$@"
    elif [[ -x /usr/bin/time ]]; then
        /usr/bin/time -f "$tool: phase $name: %e s wall, %U s user, %S s sys, max RSS %M KiB" "$@"
    else
        local start=$SECONDS
        "$@"
        log "phase $name: $((SECONDS - start)) s wall"
    fi
}

# cache_lock NAME: hold $cache_root/NAME.lock (fd 9) until the script exits; one build
# of a version at a time, a second caller waits and should then check the cache again.
cache_lock() {
    mkdir -p "$cache_root"
    exec 9>"$cache_root/$1.lock"
    if ! flock -n 9; then
        log "waiting for another build of $1"
        flock 9
    fi
}

# mod_fetch MODULE VERSION: download MODULE@VERSION (and its go.mod) into the module
# cache; sets mod_dir (its read-only source directory), mod_time (the tag's time, which
# the scripts use as build date so that builds are reproducible) and mod_commit (the
# commit the proxy recorded for the tag, or "" when the proxy does not say).
mod_fetch() {
    local json
    json=$(go mod download -json "$1@$2") || die "go mod download $1@$2 failed: $json"
    # one tab-separated line: Dir, Time, Origin.Hash
    local fields
    fields=$(python3 -c '
import json, sys
d = json.loads(sys.stdin.read())
if d.get("Error"):
    sys.exit(d["Error"])
info = json.load(open(d["Info"]))
print("\t".join([d["Dir"], info.get("Time", ""), (info.get("Origin") or {}).get("Hash", "")]))
' <<<"$json") || die "cannot read what go mod download said about $1@$2"
    # shellcheck disable=SC2034 # mod_time and mod_commit are for the sourcing script
    IFS=$'\t' read -r mod_dir mod_time mod_commit <<<"$fields"
    [[ -d $mod_dir ]] || die "no source directory for $1@$2"
}
