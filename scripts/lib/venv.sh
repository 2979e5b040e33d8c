# ensure_venv: create .venv (once) and install the package with its dev
# tools whenever pyproject.toml changes. Sourced after common.sh.
# On Debian, `python3 -m venv` needs the pythonX.Y-venv package (ensurepip);
# it is apt-installed when missing, and a half-made venv without pip is rebuilt.
ensure_venv() {
  local venv="${TAILGUARD_VENV:-$TAILGUARD_ROOT/.venv}"
  local py="${TAILGUARD_PYTHON:-python3}"
  command -v "$py" >/dev/null || die "python3 (3.11+) not found; set TAILGUARD_PYTHON to its path"
  "$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
    || die "tailguard needs Python 3.11+, $py is $("$py" --version 2>&1); set TAILGUARD_PYTHON"
  if [ -x "$venv/bin/python" ] && ! "$venv/bin/python" -m pip --version >/dev/null 2>&1; then
    say "virtual environment $venv has no pip (an earlier venv creation failed): recreating it"
    rm -rf "$venv"
  fi
  if [ ! -x "$venv/bin/python" ]; then
    say "creating virtual environment in $venv"
    if ! "$py" -m venv "$venv" >"$TAILGUARD_RUN/venv.log" 2>&1; then
      rm -rf "$venv"
      command -v apt-get >/dev/null || { cat "$TAILGUARD_RUN/venv.log" >&2; die "python3 -m venv failed"; }
      # Debian/Ubuntu ship venv's pip bootstrap separately, as pythonX.Y-venv.
      apt_install "python$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')-venv"
      "$py" -m venv "$venv" || { rm -rf "$venv"; die "python3 -m venv failed (Debian: apt-get install python3-venv)"; }
    fi
  fi
  local stamp="$venv/.tailguard-installed"
  local want; want="$(sha256sum "$TAILGUARD_ROOT/pyproject.toml" | cut -c1-16)"
  if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    say "installing tailguard and its dev tools into $venv (pip; first run takes a minute)"
    local log="$TAILGUARD_RUN/pip.log"
    { "$venv/bin/python" -m pip install -q --upgrade pip \
        && "$venv/bin/python" -m pip install -q -e "$TAILGUARD_ROOT[dev]"; } >"$log" 2>&1 \
      || { tail -n 40 "$log" >&2; die "pip install failed (log: $log)"; }
    echo "$want" >"$stamp"
  fi
  export PATH="$venv/bin:$PATH"
  VENV_PY="$venv/bin/python"
}
