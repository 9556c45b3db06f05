#!/usr/bin/env bash
# Install the router as a service that comes back after a crash: a launchd agent on macOS, a
# systemd unit on Linux (templates in deploy/). Run from the checkout, after `make setup`:
#
#   tools/install_router_service.sh            # writes the file and prints how to load it
#
# macOS reads DATABASE_URL, REDIS_URL and SECRET_KEY from .env (launchd has no env file).
set -euo pipefail
cd "$(dirname "$0")/.."
dir="$(pwd)"

env_value() {  # the value of $1 in .env, or empty
  [ -f .env ] || return 0
  sed -n "s/^$1=//p" .env | tail -n 1
}

case "$(uname -s)" in
  Darwin)
    target="$HOME/Library/LaunchAgents/org.routerpanel.router.plist"
    mkdir -p "$(dirname "$target")" var
    sed -e "s|@ROUTERPANEL_DIR@|$dir|g" \
        -e "s|@DATABASE_URL@|$(env_value DATABASE_URL)|g" \
        -e "s|@REDIS_URL@|$(env_value REDIS_URL)|g" \
        -e "s|@SECRET_KEY@|$(env_value SECRET_KEY)|g" \
        deploy/macos/org.routerpanel.router.plist > "$target"
    chmod 600 "$target"  # it holds the secret key
    echo "wrote $target; load it with:"
    echo "  launchctl bootstrap gui/\$(id -u) $target"
    ;;
  Linux)
    target="/etc/systemd/system/routerpanel-router.service"
    sed -e "s|@ROUTERPANEL_DIR@|$dir|g" deploy/linux/routerpanel-router.service > routerpanel-router.service
    echo "wrote ./routerpanel-router.service; install and start it with:"
    echo "  sudo cp routerpanel-router.service $target && sudo systemctl daemon-reload"
    echo "  sudo systemctl enable --now routerpanel-router"
    ;;
  *)
    echo "unsupported system: $(uname -s)" >&2
    exit 1
    ;;
esac
