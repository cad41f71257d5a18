#!/usr/bin/env bash
# The Docker Compose CLI plugin, for tests/cli/test_deploy.py's `docker compose config` (no engine
# needed), into $1 (e.g. .tools/docker/cli-plugins/docker-compose).
#
# Debian ships Compose v2 from trixie on; this machine may run bookworm. So apt reads trixie's
# index from this machine's own Debian source (its first stanza, suite changed), into a private
# state directory: the system's apt configuration is not touched, and no host is named here.
# The package is checked against the hash pinned below before anything is unpacked.
set -euo pipefail
VERSION=2.26.1-4
SHA256=47681197cb2b1ab88206b42a1a92fc75f50d9530a6322d03494a473eed0408ea
out=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/lists/partial" "$(dirname "$out")"
if [ -f /etc/apt/sources.list.d/debian.sources ]; then
    awk 'BEGIN { RS = ""; ORS = "\n\n" } NR == 1' /etc/apt/sources.list.d/debian.sources | sed 's/^Suites:.*/Suites: trixie/' > "$work/trixie.sources"
    list=(-o "Dir::Etc::SourceList=$work/trixie.sources")
else  # the one-line format
    grep -m1 '^deb ' /etc/apt/sources.list | awk '{ $3 = "trixie"; print }' > "$work/trixie.list"
    list=(-o "Dir::Etc::SourceList=$work/trixie.list")
fi
apt=("${list[@]}" -o APT::Sandbox::User=root -o Dir::Etc::SourceParts=/dev/null -o "Dir::State::Lists=$work/lists" -o Dir::Cache::pkgcache= -o Dir::Cache::srcpkgcache=)
apt-get -qq "${apt[@]}" update
(cd "$work" && apt-get -qq "${apt[@]}" download "docker-compose=$VERSION")
echo "$SHA256  $(ls "$work"/docker-compose_*.deb)" | sha256sum -c --quiet
dpkg-deb --fsys-tarfile "$work"/docker-compose_*.deb | tar -xO ./usr/libexec/docker/cli-plugins/docker-compose > "$out.tmp"
chmod +x "$out.tmp" && mv "$out.tmp" "$out"
