#!/usr/bin/env python3
"""make_digits_shards.py: scikit-learn's bundled handwritten digits as WebDataset shards for CLIP training.

Usage: python3 make_digits_shards.py --out DIR [--side 32] [--train-shards 3]
       (exits 77 when scikit-learn cannot be imported)

sklearn.datasets.load_digits ships 1797 8x8 images with 17 grey levels (0..16) inside the package: nothing is
downloaded. Each becomes a grey PNG (ink bright on black, levels scaled to 0..255, upscaled bilinearly to
side x side so that an 8-pixel ViT patch covers a meaningful part of the digit), a caption "a photo of the digit
seven" and a .cls holding the digit. Samples 0..1499 go round-robin into digits-train-000.tar, -001, ...;
1500..1796 (the last writers) into digits-heldout-000.tar. DIR also gets classes.txt ("zero".."nine", one a line).
Members are named by the sample's index (000123.png, 000123.txt, 000123.cls). The shards are byte-identical on
every run (fixed mtime, owner and order). PNGs are written with zlib + struct, the tars with tarfile.
"""
import argparse
import io
import os
import struct
import sys
import tarfile
import zlib

NAMES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
NUM_TRAIN = 1500


def png_grey(pixels, side):
    """8-bit greyscale PNG of side x side bytes (row-major), filter 0 on every row."""
    raw = b"".join(b"\x00" + bytes(pixels[y * side : (y + 1) * side]) for y in range(side))

    def chunk(tag, data):
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", side, side, 8, 0, 0, 0, 0)  # bit depth 8, colour type 0 (grey)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")


def upscale(image, side):
    """Bilinear resize of an 8x8 array of 0..16 to side x side bytes (pixel centres aligned, edges clamped)."""
    n = len(image)
    out = []
    for y in range(side):
        sy = min(max((y + 0.5) * n / side - 0.5, 0.0), n - 1.0)
        y0 = int(sy)
        y1 = min(y0 + 1, n - 1)
        fy = sy - y0
        for x in range(side):
            sx = min(max((x + 0.5) * n / side - 0.5, 0.0), n - 1.0)
            x0 = int(sx)
            x1 = min(x0 + 1, n - 1)
            fx = sx - x0
            top = image[y0][x0] * (1 - fx) + image[y0][x1] * fx
            bottom = image[y1][x0] * (1 - fx) + image[y1][x1] * fx
            out.append(int(round((top * (1 - fy) + bottom * fy) * 255 / 16)))
    return out


def add_member(tar, name, data):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = 0
    info.mode = 0o644
    info.uname = info.gname = ""
    tar.addfile(info, io.BytesIO(data))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="directory for the shards and classes.txt (created)")
    parser.add_argument("--side", type=int, default=32, help="image side in pixels (default 32)")
    parser.add_argument("--train-shards", type=int, default=3, help="number of training shards (default 3)")
    args = parser.parse_args()
    if args.side < 8 or args.train_shards < 1:
        parser.error("--side must be >= 8 and --train-shards >= 1")
    try:
        from sklearn.datasets import load_digits
    except ImportError as e:
        print(
            f"make_digits_shards.py: cannot import scikit-learn with {sys.executable} ({e}); hint: install it, "
            "e.g. apt-get install python3-sklearn (Debian) or pip install scikit-learn",
            file=sys.stderr,
        )
        sys.exit(77)

    digits = load_digits()
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "classes.txt"), "w") as f:
        f.write("".join(name + "\n" for name in NAMES))

    names = [f"digits-train-{k:03d}.tar" for k in range(args.train_shards)] + ["digits-heldout-000.tar"]
    tars = [tarfile.open(os.path.join(args.out, name), "w", format=tarfile.PAX_FORMAT) for name in names]
    counts = [0] * len(tars)
    for i, (image, digit) in enumerate(zip(digits.images, digits.target)):
        shard = i % args.train_shards if i < NUM_TRAIN else len(tars) - 1
        pixels = upscale([[float(v) for v in row] for row in image], args.side)
        key = f"{i:06d}"
        add_member(tars[shard], key + ".png", png_grey(pixels, args.side))
        add_member(tars[shard], key + ".txt", f"a photo of the digit {NAMES[int(digit)]}".encode())
        add_member(tars[shard], key + ".cls", f"{int(digit)}".encode())
        counts[shard] += 1
    for tar in tars:
        tar.close()
    for name, count in zip(names, counts):
        print(f"make_digits_shards.py: {os.path.join(args.out, name)}: {count} samples ({args.side}x{args.side} PNG)")


if __name__ == "__main__":
    main()
