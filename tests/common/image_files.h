// image_files.h: image-text files written byte by byte for tests (tests/unit/test_image_text.cpp, tests/e2e/
// test_clip_cli.cpp): a ustar writer, a PNG writer (zlib), and a file writer. Header-only.
#pragma once

#include <zlib.h>

#include <array>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

namespace ms::test {

using Bytes = std::vector<uint8_t>;

inline void write_file(const std::string& path, const std::string& bytes) {
    std::ofstream f(path, std::ios::binary);
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

inline std::string as_string(const Bytes& b) { return std::string(b.begin(), b.end()); }

// ---- a ustar writer: regular files only, names up to 100 bytes ----

struct TarFile {
    std::string name, data;
};

inline std::string tar_bytes(const std::vector<TarFile>& files) {
    std::string out;
    for (const TarFile& f : files) {
        char h[512] = {};
        std::snprintf(h, 100, "%s", f.name.c_str());
        std::snprintf(h + 100, 8, "%07o", 0644);
        std::snprintf(h + 108, 8, "%07o", 0);
        std::snprintf(h + 116, 8, "%07o", 0);
        std::snprintf(h + 124, 12, "%011o", static_cast<unsigned>(f.data.size()));
        std::snprintf(h + 136, 12, "%011o", 0);
        h[156] = '0';
        std::memcpy(h + 257,
                    "ustar\0"
                    "00",
                    8);
        std::memset(h + 148, ' ', 8);
        unsigned sum = 0;
        for (char c : h) sum += static_cast<uint8_t>(c);
        std::snprintf(h + 148, 8, "%06o", sum);
        out.append(h, 512);
        out += f.data;
        out.append((512 - f.data.size() % 512) % 512, '\0');
    }
    out.append(1024, '\0');
    return out;
}

// ---- a PNG writer: any colour type and bit depth, rows given packed (without filter bytes) ----

inline std::string png_chunk(const char* tag, const std::string& data) {
    std::string out;
    const uint32_t n = static_cast<uint32_t>(data.size());
    for (int s = 24; s >= 0; s -= 8) out += static_cast<char>(n >> s);
    const std::string body = std::string(tag, 4) + data;
    out += body;
    const uint32_t crc =
        static_cast<uint32_t>(crc32(0, reinterpret_cast<const Bytef*>(body.data()), static_cast<uInt>(body.size())));
    for (int s = 24; s >= 0; s -= 8) out += static_cast<char>(crc >> s);
    return out;
}

inline std::string png_bytes(int w, int h, int depth, int colour_type, const Bytes& packed_rows,
                             const Bytes& palette = {}, const Bytes& trns = {}) {
    std::string ihdr;
    for (uint32_t v : {static_cast<uint32_t>(w), static_cast<uint32_t>(h)}) {
        for (int s = 24; s >= 0; s -= 8) ihdr += static_cast<char>(v >> s);
    }
    ihdr += static_cast<char>(depth);
    ihdr += static_cast<char>(colour_type);
    ihdr.append(3, '\0');
    const size_t row = packed_rows.size() / static_cast<size_t>(h);
    std::string raw;
    for (int y = 0; y < h; ++y) {
        raw += '\0';
        raw.append(reinterpret_cast<const char*>(packed_rows.data()) + y * row, row);
    }
    uLongf n = compressBound(static_cast<uLong>(raw.size()));
    std::string z(n, '\0');
    compress(reinterpret_cast<Bytef*>(z.data()), &n, reinterpret_cast<const Bytef*>(raw.data()),
             static_cast<uLong>(raw.size()));
    z.resize(n);
    std::string out = "\x89PNG\r\n\x1a\n" + png_chunk("IHDR", ihdr);
    if (!palette.empty()) out += png_chunk("PLTE", as_string(palette));
    if (!trns.empty()) out += png_chunk("tRNS", as_string(trns));
    return out + png_chunk("IDAT", z) + png_chunk("IEND", "");
}

// an 8-bit RGB PNG of a w x h image filled by colour(x, y)
template <typename F>
std::string rgb_png(int w, int h, F colour) {
    Bytes rows;
    for (int y = 0; y < h; ++y) {
        for (int x = 0; x < w; ++x) {
            const std::array<uint8_t, 3> c = colour(x, y);
            rows.insert(rows.end(), c.begin(), c.end());
        }
    }
    return png_bytes(w, h, 8, 2, rows);
}

}  // namespace ms::test
