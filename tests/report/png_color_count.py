#!/usr/bin/env python3
"""Counts the pixels of a PNG screenshot close to each given colour (stdlib only: zlib + struct).

usage: png_color_count.py FILE.png RRGGBB [RRGGBB ...]  ->  prints one count per colour, in order.
Used by the `keel report` test to see that the curves were drawn, not just that the page loaded.
"""
import struct
import sys
import zlib


def read_png(path):
    data = open(path, "rb").read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise SystemExit(f"{path}: not a PNG")
    pos, idat, width, height, ctype = 8, b"", 0, 0, 0
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, ctype, _, _, interlace = struct.unpack(">IIBBBBB", body)
            if depth != 8 or ctype not in (2, 6) or interlace:
                raise SystemExit(f"{path}: unsupported PNG (depth {depth}, type {ctype})")
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    bpp = 4 if ctype == 6 else 3
    raw, stride = zlib.decompress(idat), width * bpp
    rows, prev = [], bytearray(stride)
    for y in range(height):
        f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(line)
        prev = line
    return width, height, bpp, rows


def main():
    width, height, bpp, rows = read_png(sys.argv[1])
    wanted = [tuple(int(h[i:i + 2], 16) for i in (0, 2, 4)) for h in sys.argv[2:]]
    counts = [0] * len(wanted)
    for line in rows:
        for x in range(0, width * bpp, bpp):
            r, g, b = line[x], line[x + 1], line[x + 2]
            for k, (wr, wg, wb) in enumerate(wanted):
                if abs(r - wr) <= 10 and abs(g - wg) <= 10 and abs(b - wb) <= 10:
                    counts[k] += 1
    print(" ".join(str(c) for c in counts))


if __name__ == "__main__":
    main()
