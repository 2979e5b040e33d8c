# ensure_venv: create .venv (once) and install the package with its dev
# tools whenever pyproject.toml changes. Sourced after common.sh.
ensure_venv() {
  local venv="${TAILGUARD_VENV:-$TAILGUARD_ROOT/.venv}"
  local py="${TAILGUARD_PYTHON:-python3}"
  command -v "$py" >/dev/null || die "python3 (3.11+) not found; set TAILGUARD_PYTHON to its path"
  "$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
    || die "tailguard needs Python 3.11+, $py is $("$py" --version 2>&1); set TAILGUARD_PYTHON"
  if [ ! -x "$venv/bin/python" ]; then
    say "creating virtual environment in $venv"
    "$py" -m venv "$venv" || die "python3 -m venv failed (Debian: apt-get install python3-venv)"
  fi
  local stamp="$venv/.tailguard-installed"
  local want; want="$(sha256sum "$TAILGUARD_ROOT/pyproject.toml" | cut -c1-16)"
  if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    say "installing tailguard and its dev tools into $venv (pip; first run takes a minute)"
    "$venv/bin/python" -m pip install -q --upgrade pip >/dev/null
    "$venv/bin/python" -m pip install -q -e "$TAILGUARD_ROOT[dev]" || die "pip install failed (see above)"
    echo "$want" >"$stamp"
  fi
  export PATH="$venv/bin:$PATH"
  VENV_PY="$venv/bin/python"
}
