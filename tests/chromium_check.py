#!/usr/bin/env python3
"""chromium_check.py: open a page as a person would, in headless Chromium, and judge the screenshot.

    python3 tests/chromium_check.py PAGE.html|PICTURE.svg SHOT.png [WIDTH HEIGHT]
    python3 tests/chromium_check.py --self-test DIR

Exit 0 when the page drew something (the screenshot is not one flat colour:
at least 1% of its pixels differ from the most common one) and logged nothing
on the console (the pages have no scripts: any message is an error); 1 otherwise, saying why; 77 when Chromium is not
installed.  --self-test checks that a blank page and a page with a console
error are both refused, so the judge can fail.
"""
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import zlib

SKIP = 77


def chromium():
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    return None


def shoot(browser, page, shot, width, height):
    """Screenshot page into shot; returns Chromium's log (stderr)."""
    profile = tempfile.mkdtemp(prefix="spmd-chromium-")
    try:
        args = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--user-data-dir=" + profile, "--enable-logging=stderr", "--v=0",
                "--window-size=%d,%d" % (width, height), "--screenshot=" + shot,
                "file://" + os.path.abspath(page)]
        r = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120)
        return r.stderr.decode("utf-8", "replace")
    finally:
        shutil.rmtree(profile, ignore_errors=True)


def console_errors(log):
    """Every console message: the pages have no scripts, so any message
    (a failed load, a parse error, an uncaught exception) is a problem."""
    return [line.strip() for line in log.splitlines() if ":CONSOLE" in line]


def paeth(a, b, c):
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    return a if pa <= pb and pa <= pc else b if pb <= pc else c


def png_pixels(path):
    """(width, height, rows of bytes, bytes per pixel) of an 8-bit RGB or RGBA PNG."""
    data = open(path, "rb").read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG")
    pos, idat, ihdr = 8, b"", None
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            ihdr = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    w, h, depth, ctype = ihdr[0], ihdr[1], ihdr[2], ihdr[3]
    if depth != 8 or ctype not in (2, 6):
        raise ValueError("expected an 8-bit RGB(A) PNG, found depth %d colour type %d" % (depth, ctype))
    bpp = 3 if ctype == 2 else 4
    raw, stride, rows, prev = zlib.decompress(idat), w * bpp, [], bytearray(w * bpp)
    for y in range(h):
        f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            line[i] = (line[i] + (0, a, b, (a + b) // 2, paeth(a, b, c))[f]) & 255
        rows.append(bytes(line))
        prev = line
    return w, h, rows, bpp


def blank(path):
    """Why the screenshot looks blank, or None."""
    w, h, rows, bpp = png_pixels(path)
    counts = {}
    for y in range(0, h, 2):
        row = rows[y]
        for x in range(0, w, 2):
            px = row[x * bpp:x * bpp + 3]
            counts[px] = counts.get(px, 0) + 1
    total = sum(counts.values())
    top = max(counts.values())
    if total - top < total // 100:
        return "%.2f%% of the pixels differ from the background" % (100.0 * (total - top) / total)
    return None


def check(browser, page, shot, width, height):
    log = shoot(browser, page, shot, width, height)
    if not os.path.exists(shot):
        return ["no screenshot of %s:\n%s" % (page, log[-2000:])]
    problems = ["console: " + e for e in console_errors(log)]
    why = blank(shot)
    if why:
        problems.append("%s looks blank: %s" % (shot, why))
    return problems


def self_test(browser, d):
    pages = {"blank.html": "<!DOCTYPE html><html><body></body></html>",
             "error.html": "<!DOCTYPE html><html><body><h1>text</h1><p>" + "words " * 400 +
                           "</p><script>console.error('boom')</script></body></html>"}
    ok = True
    for name, text in pages.items():
        page = os.path.join(d, name)
        open(page, "w").write(text)
        problems = check(browser, page, page + ".png", 800, 600)
        if not problems:
            print("FAIL: the judge passed %s" % name)
            ok = False
    return ok


def main():
    browser = chromium()
    if not browser:
        print("SKIP: chromium is not installed (scripts/setup.sh installs it)")
        return SKIP
    if sys.argv[1] == "--self-test":
        return 0 if self_test(browser, sys.argv[2]) else 1
    page, shot = sys.argv[1], sys.argv[2]
    width = int(sys.argv[3]) if len(sys.argv) > 3 else 1280
    height = int(sys.argv[4]) if len(sys.argv) > 4 else 1600
    problems = check(browser, page, shot, width, height)
    for p in problems:
        print("FAIL: " + p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
