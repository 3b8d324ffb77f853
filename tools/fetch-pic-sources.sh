#!/usr/bin/env bash
# Fetches, from Debian's archive, the sources of the installed abseil, protobuf and re2 (the exact
# versions dpkg has, Debian's patches applied) into DIR (default .deps/debian-src), for the
# self-contained libhisparse (cmake/portable_client.cmake).
#
# Why: Debian builds these static archives -fPIE, not -fPIC. Everything in them links into a
# shared library except thread-local variables, which -fPIE code reaches with local-exec TLS
# relocations (R_X86_64_TPOFF32) that no shared library may hold. Six translation units have
# them (protobuf's arena.cc, re2's re2.cc, abseil's sysinfo.cc, cordz_functions.cc,
# pool_urbg.cc, raw_hash_set.cc); the build recompiles just those with -fPIC against the
# installed headers and links them ahead of the archives. Idempotent: quiet when DIR already
# holds these versions. Needs apt-get and dpkg-source (dpkg-dev), not root.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-.deps/debian-src}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
want=""
for pkg in libabsl-dev libprotobuf-dev libre2-dev; do
  want+="$(dpkg-query -W -f='${source:Package}=${source:Version}' "$pkg") "
done
[[ -f $dir/VERSIONS && $(cat "$dir/VERSIONS") == "$want" ]] && exit 0
echo "fetch-pic-sources: fetching $want into $dir"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# The source archives of the machine's own apt sources: each configured "deb" entry (one-line
# sources.list files and deb822 .sources files alike) as "deb-src", so that the sources come from
# wherever this machine's binaries came from.
mkdir -p "$tmp/sources.list.d"
for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
  [[ -f $f ]] && sed -n 's/^[[:space:]]*deb[[:space:]]/deb-src /p' "$f"
done >"$tmp/sources.list"
for f in /etc/apt/sources.list.d/*.sources; do
  [[ -f $f ]] && sed 's/^Types:.*/Types: deb-src/' "$f" >"$tmp/sources.list.d/$(basename "$f")"
done
if [[ ! -s $tmp/sources.list ]] && ! compgen -G "$tmp/sources.list.d/*.sources" >/dev/null; then
  echo "fetch-pic-sources: no apt sources configured on this machine" >&2
  exit 1
fi
mkdir -p "$tmp/lists/partial"
# Everything apt writes goes under $tmp, so that this needs no root and leaves the system's apt
# state as it was.
mkdir -p "$tmp/cache/archives/partial"
apt_opts=(-q -o "Dir::Etc::SourceList=$tmp/sources.list" -o "Dir::Etc::SourceParts=$tmp/sources.list.d"
  -o "Dir::State::Lists=$tmp/lists" -o "Dir::Cache=$tmp/cache" -o "Dir::State::status=/var/lib/dpkg/status")
[[ $(id -u) -eq 0 ]] && apt_opts+=(-o APT::Sandbox::User=root)
apt-get "${apt_opts[@]}" update >/dev/null
(cd "$tmp" && apt-get "${apt_opts[@]}" source --download-only $want >/dev/null)
rm -rf "${dir:?}"/*
for dsc in "$tmp"/*.dsc; do
  dpkg-source --no-check -x "$dsc" "$dir/$(basename "$dsc" .dsc | cut -d_ -f1)" >/dev/null
done
rm -f "$dir"/*.orig.tar.*
echo "$want" >"$dir/VERSIONS"
