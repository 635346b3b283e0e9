#!/bin/sh
# Renders nginx.conf.template with the ${TOST_...} variables (defaults below) and runs nginx in the
# foreground. The image's entrypoint; the tests run the same script against Debian's nginx.
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
