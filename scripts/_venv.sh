# Sourced by scripts/*: create .venv on first use and install the project into it, every
# dependency at the version constraints.txt pins (the versions the image installs too).
# Re-installs only when pyproject.toml or constraints.txt changed since the last install.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
extras="${1:-}"
venv="${VENV:-$root/.venv}"
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
stamp="$venv/.installed${extras:+-$extras}"
current() { [ -f "$1" ] && [ ! pyproject.toml -nt "$1" ] && [ ! constraints.txt -nt "$1" ]; }
# A wider install serves a narrower one: the test extra holds every other extra's
# packages, and any install holds the project's own.
serves=("$stamp" "$venv/.installed-test")
if [ -z "$extras" ]; then serves+=("$venv"/.installed-*); fi
installed=false
for done in "${serves[@]}"; do
  if current "$done"; then installed=true; fi
done
if [ "$installed" = false ]; then
  "$venv/bin/python" -m pip install -q --upgrade pip
  "$venv/bin/python" -m pip install -q -c constraints.txt -e ".${extras:+[$extras]}"
  touch "$stamp"
fi
export PATH="$venv/bin:$PATH"
