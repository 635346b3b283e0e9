#!/bin/sh
# Renders nginx.conf.template with the ${TOST_...} variables (defaults below) and runs nginx in the
# foreground. The image's entrypoint; the tests run the same script against Debian's nginx.
# A value that is not what its variable means exits 2 with one line naming it.
#   TOST_PROXY_TEMPLATE  the template (default: beside this script, or /etc/tost-grpc-proxy)
#   TOST_NGINX_BIN       nginx (default: nginx on PATH)
#   TOST_PROXY_GLOBALS   extra main-context directives for -g (the tests, run as root: "user root;")
set -eu
here=$(cd "$(dirname "$0")" && pwd)
: "${TOST_PROXY_TEMPLATE:=$here/nginx.conf.template}"
[ -f "$TOST_PROXY_TEMPLATE" ] || TOST_PROXY_TEMPLATE=/etc/tost-grpc-proxy/nginx.conf.template
: "${TOST_GRPC_UPSTREAM:?the server's gRPC address, host:port}"
: "${TOST_GRPC_PROXY_PORT:=8500}"
: "${TOST_PROXY_CALLS_PER_SECOND:=1000}"
: "${TOST_PROXY_CALL_BURST:=2000}"
: "${TOST_PROXY_CONNECTIONS_PER_CLIENT:=64}"
: "${TOST_PROXY_UPSTREAM_MAX_CONNS:=256}"
: "${TOST_PROXY_WORKERS:=2}"
: "${TOST_PROXY_RUN_DIR:=/tmp/tost-grpc-proxy}"
: "${TOST_PROXY_ACCESS_LOG:=/dev/stdout tost_grpc}"
: "${TOST_NGINX_BIN:=nginx}"
# Each value lands inside nginx.conf: a value that is not what its variable means is refused by
# name here, before it can end a directive early (a ';' or '{') or fail later as nginx's guess.
refuse() {
  echo "tost-grpc-proxy: $1: expected $2, got '$3'" >&2
  exit 2
}
whole_number() {  # NAME VALUE MAX
  case "$2" in '' | *[!0-9]*) refuse "$1" "a whole number from 1 to $3" "$2" ;; esac
  if [ "${#2}" -gt 9 ] || [ "$2" -lt 1 ] || [ "$2" -gt "$3" ]; then
    refuse "$1" "a whole number from 1 to $3" "$2"
  fi
}
plain_path() {  # NAME VALUE: an absolute path without spaces, quotes or nginx's ; { } $
  case "$2" in
    /*) ;;
    *) refuse "$1" "an absolute path" "$2" ;;
  esac
  case "$2" in *[!A-Za-z0-9/._+@=,-]*) refuse "$1" "a path of letters, digits and /._+@=,- only" "$2" ;; esac
}
host_port() {  # NAME VALUE WHAT: [host:]port with a name, IPv4 or [IPv6] host
  case "$2" in
    *[!A-Za-z0-9.:_\[\]-]* | *:) refuse "$1" "$3" "$2" ;;
  esac
  case "${2##*:}" in '' | *[!0-9]*) refuse "$1" "$3" "$2" ;; esac
  whole_number "$1 (its port)" "${2##*:}" 65535
}
host_port TOST_GRPC_PROXY_PORT "$TOST_GRPC_PROXY_PORT" "a port, or address:port to listen on one address"
whole_number TOST_PROXY_CALLS_PER_SECOND "$TOST_PROXY_CALLS_PER_SECOND" 1000000
whole_number TOST_PROXY_CALL_BURST "$TOST_PROXY_CALL_BURST" 10000000
whole_number TOST_PROXY_CONNECTIONS_PER_CLIENT "$TOST_PROXY_CONNECTIONS_PER_CLIENT" 65535
whole_number TOST_PROXY_UPSTREAM_MAX_CONNS "$TOST_PROXY_UPSTREAM_MAX_CONNS" 65535
whole_number TOST_PROXY_WORKERS "$TOST_PROXY_WORKERS" 256
case "$TOST_GRPC_UPSTREAM" in
  *:*) host_port TOST_GRPC_UPSTREAM "$TOST_GRPC_UPSTREAM" "host:port (a name, IPv4 or [IPv6] address)" ;;
  *) refuse TOST_GRPC_UPSTREAM "host:port (a name, IPv4 or [IPv6] address)" "$TOST_GRPC_UPSTREAM" ;;
esac
plain_path TOST_PROXY_RUN_DIR "$TOST_PROXY_RUN_DIR"
case "$TOST_PROXY_ACCESS_LOG" in
  off | "/dev/stdout tost_grpc") ;;
  *)
    log_path=${TOST_PROXY_ACCESS_LOG%% *}
    plain_path TOST_PROXY_ACCESS_LOG "$log_path"
    case "${TOST_PROXY_ACCESS_LOG#"$log_path"}" in
      "" | " tost_grpc") ;;
      *) refuse TOST_PROXY_ACCESS_LOG "off, or a path optionally followed by ' tost_grpc'" "$TOST_PROXY_ACCESS_LOG" ;;
    esac
    ;;
esac
case "$TOST_PROXY_ACCESS_LOG" in
  off) TOST_PROXY_ACCESS_LOG_ARGS=off ;;
  *) TOST_PROXY_ACCESS_LOG_ARGS="$TOST_PROXY_ACCESS_LOG buffer=64k flush=1s if=\$tost_logged" ;;
esac
# TLS at the proxy: both files, or neither.
TOST_PROXY_LISTEN_TLS=
TOST_PROXY_TLS_DIRECTIVES=
if [ -n "${TOST_PROXY_TLS_CERT_FILE:-}${TOST_PROXY_TLS_KEY_FILE:-}" ]; then
  : "${TOST_PROXY_TLS_CERT_FILE:?is needed with TOST_PROXY_TLS_KEY_FILE}"
  : "${TOST_PROXY_TLS_KEY_FILE:?is needed with TOST_PROXY_TLS_CERT_FILE}"
  for name in TOST_PROXY_TLS_CERT_FILE TOST_PROXY_TLS_KEY_FILE; do
    eval "f=\$$name"
    plain_path "$name" "$f"
    [ -r "$f" ] || refuse "$name" "a readable file" "$f"
  done
  TOST_PROXY_LISTEN_TLS=ssl
  TOST_PROXY_TLS_DIRECTIVES="ssl_certificate $TOST_PROXY_TLS_CERT_FILE; ssl_certificate_key $TOST_PROXY_TLS_KEY_FILE; ssl_protocols TLSv1.2 TLSv1.3;"
fi
hard=$(ulimit -Hn)
if [ "$hard" = unlimited ] || [ "$hard" -gt 65536 ]; then hard=65536; fi
TOST_PROXY_OPEN_FILES=$hard
TOST_PROXY_WORKER_CONNECTIONS=$((hard / 2))
: "${TOST_PROXY_GLOBALS:=}"
export TOST_GRPC_UPSTREAM TOST_GRPC_PROXY_PORT TOST_PROXY_CALLS_PER_SECOND TOST_PROXY_CALL_BURST \
  TOST_PROXY_CONNECTIONS_PER_CLIENT TOST_PROXY_UPSTREAM_MAX_CONNS TOST_PROXY_WORKERS \
  TOST_PROXY_RUN_DIR TOST_PROXY_ACCESS_LOG_ARGS TOST_PROXY_OPEN_FILES TOST_PROXY_WORKER_CONNECTIONS \
  TOST_PROXY_LISTEN_TLS TOST_PROXY_TLS_DIRECTIVES
for d in body proxy fastcgi uwsgi scgi; do mkdir -p "$TOST_PROXY_RUN_DIR/$d"; done
# Only our variables: nginx's own $variables stay as they are.
envsubst '${TOST_GRPC_UPSTREAM} ${TOST_GRPC_PROXY_PORT} ${TOST_PROXY_CALLS_PER_SECOND} ${TOST_PROXY_CALL_BURST} ${TOST_PROXY_CONNECTIONS_PER_CLIENT} ${TOST_PROXY_UPSTREAM_MAX_CONNS} ${TOST_PROXY_WORKERS} ${TOST_PROXY_RUN_DIR} ${TOST_PROXY_ACCESS_LOG_ARGS} ${TOST_PROXY_OPEN_FILES} ${TOST_PROXY_WORKER_CONNECTIONS} ${TOST_PROXY_LISTEN_TLS} ${TOST_PROXY_TLS_DIRECTIVES}' \
  <"$TOST_PROXY_TEMPLATE" >"$TOST_PROXY_RUN_DIR/nginx.conf"
set -- -p "$TOST_PROXY_RUN_DIR" -c "$TOST_PROXY_RUN_DIR/nginx.conf" -e stderr
"$TOST_NGINX_BIN" "$@" -g "daemon off; $TOST_PROXY_GLOBALS" -t -q
exec "$TOST_NGINX_BIN" "$@" -g "daemon off; $TOST_PROXY_GLOBALS"
