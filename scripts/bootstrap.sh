#!/usr/bin/env bash
# Set up a Debian/Ubuntu machine to develop and test Sluice. Idempotent and quick to re-run.
#
#   1. apt packages: zookeeper (the coordination service brokers use), kcat (Kafka CLI client
#      for manual checks), a Java runtime (ZooKeeper and Spark), PostgreSQL's and MariaDB's
#      server binaries (the tests, drills and benchmarks start private servers; the packages'
#      own services are kept from starting during the install), iproute2 and iptables (hosts
#      in network namespaces and the network faults between them, sluice.ops.netns and
#      sluice.chaos.netfaults), chromium and chromium-driver (the manager console's browser tests),
#      and venv support for the system Python 3.11.
#      `apt-get update` and `apt-get install` run only when something is missing.
#   2. <repo>/.venv with Python 3.11, and `pip install -e '.[test,docs]'` in it (docs: MkDocs,
#      which builds the user guide's site). The pip step is skipped while
#      .venv/.bootstrap-pyproject.sha256 matches the sha256 of pyproject.toml.
#
# Run as root, or as a user with sudo. Environment: PYTHON=/path/to/python3.11 picks the
# interpreter; BOOTSTRAP_FORCE_PIP=1 re-runs the pip step.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$REPO/.venv"
STAMP="$VENV/.bootstrap-pyproject.sha256"

say() { printf 'bootstrap: %s\n' "$*"; }
die() { printf 'bootstrap: error: %s\n' "$*" >&2; exit 1; }

# Run a noisy command quietly; on failure show the end of its output and stop.
quiet() {
    local log
    log="$(mktemp -t sluice-bootstrap.XXXXXX)"
    if ! "$@" >"$log" 2>&1; then
        printf 'bootstrap: error: command failed: %s\n--- last lines of its output ---\n' "$*" >&2
        tail -n 40 "$log" >&2
        rm -f "$log"
        exit 1
    fi
    rm -f "$log"
}

# Is a Debian package installed?
installed() { [ "$(dpkg-query -W -f='${db:Status-Status}' "$1" 2>/dev/null)" = "installed" ]; }

# Is the given interpreter Python 3.11?
is_py311() { "$1" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' >/dev/null 2>&1; }

# --- Python 3.11 ----------------------------------------------------------------------------------
# Only needed to create the venv; an existing 3.11 venv is reused without looking further.
find_python() {
    local candidate
    for candidate in "${PYTHON:-}" python3.11 python3 /usr/bin/python3.11 /usr/bin/python3; do
        [ -n "$candidate" ] || continue
        candidate="$(command -v "$candidate" 2>/dev/null)" || continue
        if is_py311 "$candidate"; then
            # Resolve wrappers such as pyenv shims to the interpreter itself.
            "$candidate" -c 'import sys; print(sys.executable)'
            return 0
        fi
    done
    return 1
}

need_venv=0
if [ -x "$VENV/bin/python" ]; then
    is_py311 "$VENV/bin/python" \
        || die "$VENV exists but is not a working Python 3.11 venv; remove it (rm -rf $VENV) and re-run"
else
    [ -e "$VENV" ] && die "$VENV exists but has no bin/python; remove it (rm -rf $VENV) and re-run"
    need_venv=1
fi

# --- apt packages ---------------------------------------------------------------------------------
missing=()
if command -v dpkg-query >/dev/null 2>&1; then
    installed zookeeper || missing+=(zookeeper)
    command -v kcat >/dev/null 2>&1 || command -v kafkacat >/dev/null 2>&1 || missing+=(kcat)
    command -v java >/dev/null 2>&1 || missing+=(default-jre-headless)
    # Maven fetches the JVM peers (scripts/peers.sh: Apache Kafka's jars, pinned).
    command -v mvn >/dev/null 2>&1 || missing+=(maven)
    compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null || missing+=(postgresql)
    command -v mariadbd >/dev/null 2>&1 || [ -x /usr/sbin/mariadbd ] || missing+=(mariadb-server)
    # ip and tc (iproute2), iptables and iptables-restore: /usr/sbin is not on every user's PATH.
    command -v ip >/dev/null 2>&1 || [ -x /usr/sbin/ip ] || [ -x /sbin/ip ] || missing+=(iproute2)
    command -v tc >/dev/null 2>&1 || [ -x /usr/sbin/tc ] || [ -x /sbin/tc ] || missing+=(iproute2)
    command -v iptables-restore >/dev/null 2>&1 || [ -x /usr/sbin/iptables-restore ] || missing+=(iptables)
    # The manager's console is tested in a real headless browser: Debian's chromium, driven by
    # selenium through chromium-driver (no browser download at test time).
    command -v chromium >/dev/null 2>&1 || missing+=(chromium)
    command -v chromedriver >/dev/null 2>&1 || missing+=(chromium-driver)
    if [ "$need_venv" = 1 ]; then
        if PY="$(find_python)"; then
            # A Debian/Ubuntu system Python creates venvs only with python3.11-venv installed.
            case "$(readlink -f "$PY")" in
                /usr/bin/*) installed python3.11-venv || missing+=(python3.11-venv) ;;
            esac
        else
            missing+=(python3.11 python3.11-venv)
        fi
    fi
else
    # Not Debian-like: check, and tell what to install by hand.
    [ -f /usr/share/java/zookeeper.jar ] || die "ZooKeeper is missing and this is not a Debian/Ubuntu machine (no dpkg): install ZooKeeper 3.8 so that /usr/share/java/zookeeper.jar exists"
    command -v java >/dev/null 2>&1 || die "java is missing: install a Java runtime (17+)"
    command -v kcat >/dev/null 2>&1 || die "kcat is missing: install kcat"
fi

if [ "${#missing[@]}" -gt 0 ]; then
    if [ "$(id -u)" = 0 ]; then
        SUDO=()
    elif command -v sudo >/dev/null 2>&1; then
        SUDO=(sudo)
    else
        die "need root to install ${missing[*]}: re-run as root or install sudo"
    fi
    command -v apt-get >/dev/null 2>&1 || die "apt-get not found; install by hand: ${missing[*]}"
    apt=("${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get -q -o DPkg::Lock::Timeout=300)
    say "apt-get update"
    quiet "${apt[@]}" update
    # kcat was called kafkacat before Debian 11 and Ubuntu 22.04.
    if [[ " ${missing[*]} " == *" kcat "* ]] && ! apt-cache show kcat >/dev/null 2>&1; then
        missing=("${missing[@]/#kcat/kafkacat}")
    fi
    say "apt-get install ${missing[*]}"
    # Keep the packages' services (postgresql, mariadb) from starting: Sluice runs private
    # servers on free ports. policy-rc.d answering 101 is Debian's way to say "do not start".
    policy=/usr/sbin/policy-rc.d
    added_policy=0
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\nexit 101\n' | "${SUDO[@]}" tee "$policy" >/dev/null
        "${SUDO[@]}" chmod +x "$policy"
        added_policy=1
    fi
    quiet "${apt[@]}" install -y --no-install-recommends "${missing[@]}"
    if [ "$added_policy" = 1 ]; then "${SUDO[@]}" rm -f "$policy"; fi
fi

# --- venv and the editable install ----------------------------------------------------------------
if [ "$need_venv" = 1 ]; then
    PY="$(find_python)" || die "Python 3.11 not found (tried \$PYTHON, python3.11, python3); install python3.11 or set PYTHON=/path/to/python3.11"
    say "creating $VENV with $PY"
    quiet "$PY" -m venv "$VENV"
    rm -f "$STAMP"
fi

want="$(sha256sum "$REPO/pyproject.toml" | cut -d' ' -f1)"
have="$(cat "$STAMP" 2>/dev/null || true)"
if [ "$want" != "$have" ] || [ -n "${BOOTSTRAP_FORCE_PIP:-}" ]; then
    say "pip install -e '.[test,docs]'"
    rm -f "$STAMP"
    quiet "$VENV/bin/python" -m pip install --disable-pip-version-check -q -e "$REPO[test,docs]"
    printf '%s\n' "$want" >"$STAMP"
fi

# The JVM peers Sluice is measured beside, and Spark's own Kafka source and sink for the pinned
# pyspark (sluice apply --source-format kafka), into .peers/ so that nothing is fetched at run
# time; skipped with a message when Maven Central is unreachable.
bash "$REPO/scripts/peers.sh" | sed 's/^/bootstrap: /'

say "ready ($VENV)"
