#!/bin/sh
# Install Debian packages for the tests, as root, without starting or enabling any service of this machine:
#
#     sh tools/apt_install.sh "what for" PACKAGE...
#
# Debian's packages start their daemons when installed (openssh-server starts sshd on port 22) and enable them
# for every boot; the tests run those daemons themselves, from their binaries, inside namespaces of their own.
# - While apt-get runs, /usr/sbin/policy-rc.d answers 101 ("action forbidden"): invoke-rc.d and
#   deb-systemd-invoke ask it before a maintainer script starts a service. A policy-rc.d already there (a
#   container's) is left as it is.
# - The boot links the install added (systemd's *.wants links, System V's rc?.d/S links) are removed with
#   `systemctl disable` (System V's alone with update-rc.d disable); those there before stay.
# `apt-get update` runs only if the install fails on stale lists.
set -eu
what=$1; shift
echo "apt-get install $* ($what)"
export LC_ALL=C
links() { { find /etc/systemd/system -path '*.wants/*' -type l; ls -d /etc/rc?.d/S*; } 2>/dev/null | sort; }
before=$(mktemp); links >"$before"
policy=/usr/sbin/policy-rc.d
ours=
if [ ! -e "$policy" ]; then
  ours=1
  printf '#!/bin/sh\n# written by tools/apt_install.sh while it installs packages: start no service\nexit 101\n' >"$policy"
  chmod 755 "$policy"
fi
cleanup() { [ -z "$ours" ] || rm -f "$policy"; rm -f "$before"; }
trap cleanup EXIT
export DEBIAN_FRONTEND=noninteractive
apt-get install -y -qq "$@" >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq "$@" >/dev/null; }
added=$(links | comm -13 "$before" -)
for link in $(printf '%s\n' "$added" | grep '^/etc/systemd/') $(printf '%s\n' "$added" | grep '^/etc/rc'); do
  [ -L "$link" ] || continue   # systemctl disable of a unit removes its System V links too
  name=$(basename "$link")
  case "$link" in
    /etc/systemd/*) systemctl disable --no-reload "$name" >/dev/null 2>&1 ;;
    *) name=$(echo "$name" | sed 's/^S[0-9]*//'); update-rc.d "$name" disable >/dev/null 2>&1 ;;
  esac
  echo "  $name: installed, not started, not enabled at boot"
done
