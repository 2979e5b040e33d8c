# Shared helpers for the stack scripts. Sourced, never run.
# Everything the local stack needs lives under $TAILGUARD_CACHE (jars, the
# virtual environment) and $TAILGUARD_RUN (pids, logs, data): outside the repo.

set -euo pipefail

TAILGUARD_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
TAILGUARD_CACHE="${TAILGUARD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tailguard}"
TAILGUARD_RUN="${TAILGUARD_RUN:-${TMPDIR:-/tmp}/tailguard-stack}"
# Ports of the local stack (script-only variables; change them to run a second stack).
TAILGUARD_KAFKA_PORT="${TAILGUARD_KAFKA_PORT:-9092}"                        # PLAINTEXT
TAILGUARD_KAFKA_CONTROLLER_PORT="${TAILGUARD_KAFKA_CONTROLLER_PORT:-9093}"  # KRaft controller
TAILGUARD_KAFKA_SASL_SSL_PORT="${TAILGUARD_KAFKA_SASL_SSL_PORT:-9094}"      # SASL_SSL, SCRAM-SHA-512
TAILGUARD_REDIS_PORT="${TAILGUARD_REDIS_PORT:-6379}"                        # plain, no auth
TAILGUARD_REDIS_TLS_PORT="${TAILGUARD_REDIS_TLS_PORT:-6380}"                # TLS, ACL user tailguard
export TAILGUARD_KAFKA_PORT TAILGUARD_KAFKA_CONTROLLER_PORT TAILGUARD_KAFKA_SASL_SSL_PORT \
  TAILGUARD_REDIS_PORT TAILGUARD_REDIS_TLS_PORT TAILGUARD_RUN
TAILGUARD_KAFKA_BOOTSTRAP="${TAILGUARD_KAFKA_BOOTSTRAP:-127.0.0.1:$TAILGUARD_KAFKA_PORT}"
TAILGUARD_REDIS_URL="${TAILGUARD_REDIS_URL:-redis://127.0.0.1:$TAILGUARD_REDIS_PORT/0}"
export TAILGUARD_KAFKA_BOOTSTRAP TAILGUARD_REDIS_URL
mkdir -p "$TAILGUARD_CACHE" "$TAILGUARD_RUN"

say() { printf '[tailguard] %s\n' "$*" >&2; }
die() { printf '[tailguard] error: %s\n' "$*" >&2; exit 1; }

# port_open HOST PORT: true when something accepts TCP connections there.
port_open() { (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; }

# is_local_default VALUE DEFAULT: the scripts only manage the stack when the
# address is the local default; anything else is the user's own service.
is_local_default() { [ "$1" = "$2" ]; }

pid_alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

# as_root CMD...: run a package-manager command as root (directly or via sudo).
as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@";
  else die "need root to run: $* (install it yourself, then run this again)"; fi
}

# apt_install PKG...: install Debian packages that are missing (APT_NO_RECOMMENDS=1: without
# their recommended packages).
apt_install() {
  local missing=()
  for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  command -v apt-get >/dev/null || die "apt-get not found: install ${missing[*]} by hand"
  say "installing Debian packages: ${missing[*]}"
  as_root apt-get update -qq >/dev/null
  local extra=()
  [ "${APT_NO_RECOMMENDS:-}" = 1 ] && extra+=(--no-install-recommends)
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq "${extra[@]}" "${missing[@]}" >/dev/null
}
