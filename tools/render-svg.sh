#!/usr/bin/env bash
# Renders an SVG with headless Chromium to PNG and checks that the picture is
# not blank: the share of pixels that are not white (nor transparent) must be
# at least 0.5%, with more than one colour. The PNG is decoded by a few lines
# of Python (zlib; no PIL needed).
#
#   tools/render-svg.sh FILE.svg [OUT.png]     # OUT defaults to FILE.png
#
# Exit 0: rendered and not blank (one line of pixel counts); 1: blank or not
# rendered; 2: usage, or Chromium missing (Debian: apt-get install chromium).
set -euo pipefail
if [[ $# -lt 1 || $# -gt 2 || "$1" == -h || "$1" == --help ]]; then
  sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
svg=$(realpath "$1")
png=${2:-${1%.svg}.png}
[[ -f "$svg" ]] || { echo "render-svg: no file $1" >&2; exit 2; }
browser=$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)
if [[ -z "$browser" ]]; then
  echo "render-svg: Chromium not found; install it (Debian: apt-get install chromium)" >&2
  exit 2
fi
# The window is the SVG's own size (its width and height attributes).
read -r w h < <(python3 - "$svg" <<'PY'
import re, sys
head = open(sys.argv[1], encoding="utf-8").read(4096)
m = re.search(r"<svg[^>]*>", head, re.S)
tag = m.group(0) if m else ""
def num(name, default):
    a = re.search(name + r'="([0-9.]+)', tag)
    return int(float(a.group(1))) if a else default
print(num("width", 800), num("height", 600))
PY
)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# --no-sandbox: root in a container has no user namespaces; a private profile
# keeps runs apart.
"$browser" --headless --no-sandbox --disable-gpu --hide-scrollbars \
  --user-data-dir="$tmp/profile" --window-size="$w,$h" \
  --screenshot="$tmp/shot.png" "file://$svg" >"$tmp/log" 2>&1 || true
if [[ ! -s "$tmp/shot.png" ]]; then
  echo "render-svg: Chromium wrote no PNG for $1:" >&2
  tail -5 "$tmp/log" >&2
  exit 1
fi
cp "$tmp/shot.png" "$png"
python3 - "$png" <<'PY'
import struct, sys, zlib

def decode(path):
    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, w = 8, b"", 0
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            w, h, depth, ctype, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert depth == 8 and ctype in (2, 6) and interlace == 0, "unexpected PNG kind"
            bpp = 3 if ctype == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    raw, stride = zlib.decompress(idat), w * bpp
    rows, prev = [], bytearray(stride)
    for y in range(h):
        f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for x in range(stride):
            a = line[x - bpp] if x >= bpp else 0
            b, c = prev[x], prev[x - bpp] if x >= bpp else 0
            if f == 1: line[x] = (line[x] + a) & 255
            elif f == 2: line[x] = (line[x] + b) & 255
            elif f == 3: line[x] = (line[x] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[x] = (line[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(line)
        prev = line
    return w, h, bpp, rows

w, h, bpp, rows = decode(sys.argv[1])
ink, colours = 0, set()
for line in rows:
    for x in range(0, len(line), bpp):
        px = tuple(line[x:x + 3])
        alpha = line[x + 3] if bpp == 4 else 255
        if alpha > 0 and px != (255, 255, 255):
            ink += 1
            if len(colours) < 64:
                colours.add(px)
share = ink / float(w * h)
ok = share >= 0.005 and len(colours) > 1
print(f"render-svg: {sys.argv[1]}: {w}x{h}, {100 * share:.1f}% of pixels drawn, "
      f"{len(colours)}{'+' if len(colours) == 64 else ''} colours: {'ok' if ok else 'BLANK'}")
sys.exit(0 if ok else 1)
PY
