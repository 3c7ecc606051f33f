#!/bin/sh
# setup.sh: install what spmd needs from Debian's packages, if anything is missing.
set -e
PKGS="build-essential cmake python3-yaml pkg-config libyaml-dev libcmocka-dev libopenblas-dev libjansson-dev python3-numpy openmpi-bin libopenmpi-dev chromium libglpk-dev"
missing=""
for p in $PKGS; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
	echo "setup: installing$missing"
	SUDO=""
	[ "$(id -u)" = 0 ] || SUDO=sudo
	$SUDO apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing
fi
