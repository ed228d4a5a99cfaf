// test_image_text.cpp: the image-text data layer (engine/data/image_text.h): the tar reader on archives written
// here (a small ustar writer) and by Python's tarfile (pax and GNU long names), PNG and JPEG decoding of images whose
// pixels the test knows (PNGs written byte by byte with zlib, JPEGs encoded with libjpeg), the resize/crop geometry,
// the WebDataset source's errors and skipping, the synthetic shapes' determinism and captions, and the order.
#include <gtest/gtest.h>
#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <vector>
// jpeglib.h needs FILE and size_t declared before it
#include <jpeglib.h>

#include "engine/core/check.h"
#include "engine/data/image_ops.h"
#include "engine/data/image_text.h"
#include "engine/data/tar_index.h"
#include "tests/common/image_files.h"
#include "tests/common/temp_dir.h"

namespace {

namespace fs = std::filesystem;
using Bytes = std::vector<uint8_t>;

class TempDir : public ms::test::TempDir {
  public:
    TempDir() : ms::test::TempDir("ms_image_text_test") {}
};

using ms::test::as_string;
using ms::test::png_bytes;
using ms::test::rgb_png;
using ms::test::tar_bytes;
using ms::test::TarFile;
using ms::test::write_file;

ms::RgbImage decode(const std::string& bytes, int min_decoded_side = 0) {
    ms::RgbImage image;
    std::string error;
    EXPECT_TRUE(
        ms::decode_image(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), min_decoded_side, image, error))
        << error;
    return image;
}

std::string decode_error(const std::string& bytes) {
    ms::RgbImage image;
    std::string error;
    EXPECT_FALSE(ms::decode_image(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), 0, image, error));
    return error;
}

// ---- a JPEG writer (libjpeg) ----

std::string jpeg_bytes(int w, int h, int components, const Bytes& pixels, int quality) {
    jpeg_compress_struct c{};
    jpeg_error_mgr err{};
    c.err = jpeg_std_error(&err);
    jpeg_create_compress(&c);
    unsigned char* buffer = nullptr;
    unsigned long size = 0;
    jpeg_mem_dest(&c, &buffer, &size);
    c.image_width = static_cast<JDIMENSION>(w);
    c.image_height = static_cast<JDIMENSION>(h);
    c.input_components = components;
    c.in_color_space = components == 3 ? JCS_RGB : JCS_GRAYSCALE;
    jpeg_set_defaults(&c);
    jpeg_set_quality(&c, quality, TRUE);
    jpeg_start_compress(&c, TRUE);
    while (c.next_scanline < c.image_height) {
        JSAMPROW row = const_cast<uint8_t*>(pixels.data()) + static_cast<size_t>(c.next_scanline) * w * components;
        jpeg_write_scanlines(&c, &row, 1);
    }
    jpeg_finish_compress(&c);
    jpeg_destroy_compress(&c);
    std::string out(reinterpret_cast<char*>(buffer), size);
    std::free(buffer);
    return out;
}

// the 8-bit value a normalised pixel came from
float unnormalise(const std::vector<float>& pixels, int S, int c, int y, int x) {
    return (pixels[static_cast<size_t>(c * S * S + y * S + x)] * ms::kClipStd[c] + ms::kClipMean[c]) * 255.0f;
}

template <typename F>
std::string error_of(F&& f) {
    try {
        f();
    } catch (const ms::UserError& e) {
        return e.what();
    }
    ADD_FAILURE() << "no UserError was thrown";
    return {};
}

// ---- tar reader ----

TEST(ImageTextTar, ReadsUstarMembersAndTheirData) {
    TempDir dir;
    const std::string path = dir / "a.tar";
    write_file(path, tar_bytes({{"000001.txt", "a cat"}, {"sub/000002.png", std::string(700, 'x')}, {"e.cls", ""}}));
    const ms::TarIndex index = ms::read_tar_index(path, "test tar", "none");
    EXPECT_TRUE(index.damage.empty()) << index.damage;
    ASSERT_EQ(index.members.size(), 3u);
    EXPECT_EQ(index.members[0].name, "000001.txt");
    EXPECT_EQ(index.members[0].offset, 512);
    EXPECT_EQ(index.members[0].size, 5);
    EXPECT_EQ(index.members[1].name, "sub/000002.png");
    EXPECT_EQ(index.members[1].offset, 1536);
    EXPECT_EQ(index.members[1].size, 700);
    EXPECT_EQ(index.members[2].size, 0);
}

TEST(ImageTextTar, ReadsPythonTarfileLongNamesInPaxAndGnuFormats) {
    const std::string python = MS_SYSTEM_PYTHON;
    if (python.empty() || !fs::exists(python)) GTEST_SKIP() << "no system python3 (MS_SYSTEM_PYTHON)";
    TempDir dir;
    const std::string long_dir(120, 'd');  // > 100 bytes: pax 'x' path, GNU 'L' long name
    const std::string script = dir / "make.py";
    write_file(script,
               "import io, sys, tarfile\n"
               "for path, fmt in ((sys.argv[1], tarfile.PAX_FORMAT), (sys.argv[2], tarfile.GNU_FORMAT)):\n"
               "    with tarfile.open(path, 'w', format=fmt) as t:\n"
               "        d = tarfile.TarInfo('" +
                   long_dir +
                   "'); d.type = tarfile.DIRTYPE; t.addfile(d)\n"
                   "        for name, data in (('" +
                   long_dir +
                   "/000007.txt', b'caption seven'),\n"
                   "                           ('" +
                   long_dir +
                   "/000007.png', bytes(range(256)) * 3),\n"
                   "                           ('caf\\u00e9/000008.txt', b'x')):\n"
                   "            i = tarfile.TarInfo(name); i.size = len(data); t.addfile(i, io.BytesIO(data))\n"
                   "        t.addfile(tarfile.TarInfo('link'), None)\n");
    const std::string pax = dir / "pax.tar", gnu = dir / "gnu.tar";
    ASSERT_EQ(std::system((python + " " + script + " " + pax + " " + gnu).c_str()), 0);
    for (const std::string& path : {pax, gnu}) {
        SCOPED_TRACE(path);
        const ms::TarIndex index = ms::read_tar_index(path, "test tar", "none");
        EXPECT_TRUE(index.damage.empty()) << index.damage;
        ASSERT_EQ(index.members.size(), 4u);  // the directory is not a member; the empty 'link' file is
        EXPECT_EQ(index.members[0].name, long_dir + "/000007.txt");
        EXPECT_EQ(index.members[1].name, long_dir + "/000007.png");
        EXPECT_EQ(index.members[2].name, "caf\xc3\xa9/000008.txt");
        ASSERT_EQ(index.members[1].size, 768);
        const ms::ReadOnlyFile file(path, "test tar", "none");
        std::string data(768, '\0');
        ASSERT_TRUE(file.read_at(index.members[1].offset, data.data(), 768));
        for (int k = 0; k < 768; ++k) ASSERT_EQ(static_cast<uint8_t>(data[k]), k % 256) << k;
    }
}

TEST(ImageTextTar, ReportsTruncationAndRefusesNonTars) {
    TempDir dir;
    const std::string whole = tar_bytes({{"000001.txt", "a cat"}, {"000001.png", std::string(2000, 'x')}});
    const std::string cut = dir / "cut.tar";
    write_file(cut, whole.substr(0, 512 + 512 + 512 + 1000));  // inside the second member's data
    const ms::TarIndex index = ms::read_tar_index(cut, "test tar", "none");
    ASSERT_EQ(index.members.size(), 1u);
    EXPECT_NE(index.damage.find("truncated"), std::string::npos) << index.damage;
    EXPECT_EQ(index.damaged_name, "000001.png");

    const std::string junk = dir / "junk.tar";
    write_file(junk, std::string(4096, 'j'));
    const std::string error = error_of([&] { ms::read_tar_index(junk, "test tar", "none"); });
    EXPECT_NE(error.find("is not a tar archive"), std::string::npos) << error;
    EXPECT_NE(error.find(junk), std::string::npos) << error;
}

// ---- decoding ----

TEST(ImageTextDecode, PngColourTypesAndDepthsBecomeEightBitRgb) {
    // grey 8: replicated
    ms::RgbImage img = decode(png_bytes(2, 1, 8, 0, {10, 200}));
    EXPECT_EQ(img.pixels, (Bytes{10, 10, 10, 200, 200, 200}));
    // grey 1-bit: 0 and 255
    img = decode(png_bytes(3, 1, 1, 0, {0b10100000}));
    EXPECT_EQ(img.pixels, (Bytes{255, 255, 255, 0, 0, 0, 255, 255, 255}));
    // grey + alpha: alpha dropped, not composited
    img = decode(png_bytes(1, 1, 8, 4, {77, 0}));
    EXPECT_EQ(img.pixels, (Bytes{77, 77, 77}));
    // RGB 8
    img = decode(png_bytes(2, 2, 8, 2, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}));
    EXPECT_EQ(img.width, 2);
    EXPECT_EQ(img.height, 2);
    EXPECT_EQ(img.pixels, (Bytes{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}));
    // RGBA 8: alpha dropped
    img = decode(png_bytes(1, 1, 8, 6, {30, 60, 90, 0}));
    EXPECT_EQ(img.pixels, (Bytes{30, 60, 90}));
    // RGB 16: the high byte
    img = decode(png_bytes(1, 1, 16, 2, {0x12, 0xFF, 0x80, 0x00, 0xFE, 0x01}));
    EXPECT_EQ(img.pixels, (Bytes{0x12, 0x80, 0xFE}));
    // palette 4-bit with a tRNS entry: expanded, transparency dropped
    img = decode(png_bytes(2, 1, 4, 3, {0x10}, {255, 0, 0, 0, 0, 255}, {0}));
    EXPECT_EQ(img.pixels, (Bytes{0, 0, 255, 255, 0, 0}));
    EXPECT_EQ(img.source_width, 2);
}

TEST(ImageTextDecode, JpegDecodesToKnownColours) {
    // 32 x 32 with four flat 16 x 16 quadrants (whole chroma-subsampled MCUs): red, green, blue, grey
    const std::array<std::array<uint8_t, 3>, 4> quad = {{{220, 30, 30}, {30, 200, 40}, {40, 50, 230}, {128, 128, 128}}};
    Bytes rgb;
    for (int y = 0; y < 32; ++y) {
        for (int x = 0; x < 32; ++x) {
            const auto& c = quad[static_cast<size_t>((y / 16) * 2 + x / 16)];
            rgb.insert(rgb.end(), c.begin(), c.end());
        }
    }
    const ms::RgbImage img = decode(jpeg_bytes(32, 32, 3, rgb, 95));
    ASSERT_EQ(img.width, 32);
    ASSERT_EQ(img.height, 32);
    // At a quadrant's centre, quality 95 on flat MCU-aligned blocks leaves only YCbCr rounding (1 level when this
    // test was written; the chroma upsampling blends colours only near the quadrant edges). 6 levels stays clear of
    // that, while a channel swap or colour-space mistake moves a value by 90 or more.
    for (int q = 0; q < 4; ++q) {
        const int y = (q / 2) * 16 + 8, x = (q % 2) * 16 + 8;
        for (int c = 0; c < 3; ++c) {
            EXPECT_NEAR(img.pixels[static_cast<size_t>((y * 32 + x) * 3 + c)], quad[static_cast<size_t>(q)][c], 6)
                << "quadrant " << q << " channel " << c;
        }
    }
    // greyscale JPEG: replicated into RGB; a flat block keeps only its DC term, quantised to within a level or two
    const ms::RgbImage grey = decode(jpeg_bytes(16, 16, 1, Bytes(256, 90), 95));
    for (size_t k = 0; k < grey.pixels.size(); ++k) EXPECT_NEAR(grey.pixels[k], 90, 2) << k;
    // decoded at 1/4 size when a quarter still covers the side asked for
    const ms::RgbImage small = decode(jpeg_bytes(32, 32, 3, rgb, 95), 8);
    EXPECT_EQ(small.width, 8);
    EXPECT_EQ(small.source_width, 32);
}

TEST(ImageTextDecode, CorruptImagesGiveErrorsNotCrashes) {
    const std::string png = rgb_png(8, 8, [](int x, int y) {
        return std::array<uint8_t, 3>{uint8_t(x), uint8_t(y), 0};
    });
    std::string bad = png;
    bad[bad.size() - 20] ^= 0x55;  // inside IDAT: its CRC no longer matches
    EXPECT_NE(decode_error(bad).find("not a valid PNG"), std::string::npos) << decode_error(bad);
    EXPECT_NE(decode_error(png.substr(0, 40)).find("not a valid PNG"), std::string::npos);

    const std::string jpg = jpeg_bytes(16, 16, 1, Bytes(256, 90), 90);
    EXPECT_NE(decode_error(jpg.substr(0, jpg.size() / 2)).find("not a valid JPEG"), std::string::npos)
        << decode_error(jpg.substr(0, jpg.size() / 2));
    EXPECT_NE(decode_error(jpg.substr(0, 30)).find("not a valid JPEG"), std::string::npos);
    EXPECT_NE(decode_error("GIF89a......").find("GIF"), std::string::npos);
    EXPECT_NE(decode_error("hello").find("neither a PNG nor a JPEG"), std::string::npos);
}

// ---- resize and crop ----

TEST(ImageTextResize, SameSizeIsExactAndShrinkingAverages) {
    // S equal to the image: every value passes through unchanged
    ms::RgbImage img;
    img.width = img.height = 8;
    for (int k = 0; k < 8 * 8 * 3; ++k) img.pixels.push_back(static_cast<uint8_t>(k * 37 % 256));
    std::vector<float> out(3 * 8 * 8);
    ms::resize_crop_normalize(img, 8, out.data());
    for (int c = 0; c < 3; ++c) {
        for (int y = 0; y < 8; ++y) {
            for (int x = 0; x < 8; ++x) {
                const float expect =
                    (img.pixels[static_cast<size_t>((y * 8 + x) * 3 + c)] / 255.0f - ms::kClipMean[c]) /
                    ms::kClipStd[c];
                ASSERT_EQ(out[static_cast<size_t>(c * 64 + y * 8 + x)], expect) << c << " " << y << " " << x;
            }
        }
    }
    // a one-pixel checkerboard shrunk 4x: the antialiasing filter averages it to mid-grey away from the border
    // (each output's weights sum to the same over black and white pixels); a filter that skipped pixels would give
    // 0 or 255. 1e-3 levels: float rounding of the normalisation.
    img.width = img.height = 64;
    img.pixels.assign(64 * 64 * 3, 0);
    for (int y = 0; y < 64; ++y) {
        for (int x = 0; x < 64; ++x) {
            for (int c = 0; c < 3; ++c) img.pixels[static_cast<size_t>((y * 64 + x) * 3 + c)] = (x + y) % 2 ? 255 : 0;
        }
    }
    std::vector<float> small(3 * 16 * 16);
    ms::resize_crop_normalize(img, 16, small.data());
    for (int y = 1; y < 15; ++y) {
        for (int x = 1; x < 15; ++x) ASSERT_NEAR(unnormalise(small, 16, 1, y, x), 127.5f, 1e-3f) << y << " " << x;
    }
}

TEST(ImageTextResize, ShorterSideToSThenCentreCrop) {
    // 64 wide x 32 high, four vertical bands of 16 columns: red, green, blue, white. Shorter side 32 -> 16 makes it
    // 32 x 16; the centre 16 columns are the green and blue bands, 8 columns each.
    const std::array<std::array<uint8_t, 3>, 4> band = {{{255, 0, 0}, {0, 255, 0}, {0, 0, 255}, {255, 255, 255}}};
    const std::string wide = rgb_png(64, 32, [&](int x, int) { return band[static_cast<size_t>(x / 16)]; });
    std::vector<float> out(3 * 16 * 16);
    ms::resize_crop_normalize(decode(wide), 16, out.data());
    // Each output column averages 4 source columns (the 2x shrink's filter), so the columns at a band edge (0, 7, 8,
    // 15) blend two bands; the others are pure. 0.5 levels: float rounding.
    for (int y = 0; y < 16; ++y) {
        for (int x = 1; x < 15; ++x) {
            if (x == 7 || x == 8) continue;
            const auto& expect = band[x < 8 ? 1 : 2];
            for (int c = 0; c < 3; ++c) ASSERT_NEAR(unnormalise(out, 16, c, y, x), expect[c], 0.5f) << y << " " << x;
        }
    }
    // 32 wide x 64 high, horizontal bands: the crop keeps the second and third band (top half, bottom half)
    // (rows 2 and 13 are away from the blended rows 0, 7, 8, 15)
    const std::string tall = rgb_png(32, 64, [&](int, int y) { return band[static_cast<size_t>(y / 16)]; });
    ms::resize_crop_normalize(decode(tall), 16, out.data());
    EXPECT_NEAR(unnormalise(out, 16, 1, 2, 5), 255.0f, 0.5f);   // green on top
    EXPECT_NEAR(unnormalise(out, 16, 2, 13, 5), 255.0f, 0.5f);  // blue below
    EXPECT_NEAR(unnormalise(out, 16, 0, 13, 5), 0.0f, 0.5f);
    // enlarging a 4 x 4 to 8 x 8 interpolates: a flat image stays flat
    const std::string flat = rgb_png(4, 4, [](int, int) { return std::array<uint8_t, 3>{10, 100, 200}; });
    std::vector<float> big(3 * 8 * 8);
    ms::resize_crop_normalize(decode(flat), 8, big.data());
    for (int c = 0; c < 3; ++c)
        EXPECT_NEAR(unnormalise(big, 8, c, 3, 6), (std::array<float, 3>{10, 100, 200}[c]), 0.01f);
}

// ---- WebDataset source ----

std::string small_png(uint8_t r, uint8_t g, uint8_t b, int side = 16) {
    return rgb_png(side, side, [=](int, int) { return std::array<uint8_t, 3>{r, g, b}; });
}

TEST(ImageTextWebDataset, GroupsMembersIntoSamples) {
    TempDir dir;
    write_file(dir / "shard-000.tar", tar_bytes({{"000000.png", small_png(255, 0, 0)},
                                                 {"000000.txt", "  a red square\n"},
                                                 {"000000.cls", "3\n"},
                                                 {"000000.json", "{}"},
                                                 {"dir/000001.JPG", jpeg_bytes(16, 16, 1, Bytes(256, 50), 90)},
                                                 {"dir/000001.txt", "grey"}}));
    write_file(dir / "shard-001.tar",
               tar_bytes({{"000002.txt", "a blue square"}, {"000002.png", small_png(0, 0, 255)}}));
    write_file(dir / "classes.txt", "zero\none\ntwo\nthree\n\n");
    const auto src = ms::open_webdataset({dir / "shard-000.tar", dir / "shard-001.tar"}, {});
    ASSERT_EQ(src->size(), 3);
    EXPECT_EQ(src->classes(), (std::vector<std::string>{"zero", "one", "two", "three"}));
    ms::ImageTextSample s;
    ASSERT_TRUE(src->read(0, 8, s));
    EXPECT_EQ(s.key, "shard-000.tar:000000");
    EXPECT_EQ(s.caption, "a red square");
    EXPECT_EQ(s.label, 3);
    ASSERT_EQ(s.pixels.size(), 3u * 8 * 8);
    EXPECT_NEAR(unnormalise(s.pixels, 8, 0, 4, 4), 255.0f, 0.01f);
    ASSERT_TRUE(src->read(1, 8, s));
    EXPECT_EQ(s.key, "shard-000.tar:dir/000001");
    EXPECT_EQ(s.label, -1);
    ASSERT_TRUE(src->read(2, 8, s));
    EXPECT_EQ(s.key, "shard-001.tar:000002");
    EXPECT_NEAR(unnormalise(s.pixels, 8, 2, 0, 0), 255.0f, 0.01f);
    EXPECT_EQ(src->skipped(), 0);
    EXPECT_NE(src->describe().find("3 samples"), std::string::npos) << src->describe();

    // moved files keep their fingerprint (and so their order)
    TempDir moved;
    fs::copy(dir / "shard-000.tar", moved / "shard-000.tar");
    fs::copy(dir / "shard-001.tar", moved / "shard-001.tar");
    EXPECT_EQ(ms::open_webdataset({moved / "shard-000.tar", moved / "shard-001.tar"}, {})->fingerprint(),
              src->fingerprint());
    EXPECT_NE(ms::open_webdataset({dir / "shard-001.tar", dir / "shard-000.tar"}, {})->fingerprint(),
              src->fingerprint());
}

TEST(ImageTextWebDataset, BadSamplesNameShardAndKeyOrAreCountedWhenSkipped) {
    TempDir dir;
    std::string corrupt = small_png(0, 255, 0);
    corrupt[corrupt.size() - 20] ^= 0x55;
    const std::string shard = dir / "shard-000.tar";
    write_file(shard, tar_bytes({{"000000.png", small_png(255, 0, 0)},
                                 {"000000.txt", "fine"},
                                 {"000001.png", corrupt},
                                 {"000001.txt", "corrupt image"},
                                 {"000002.png", small_png(0, 0, 255, 4)},
                                 {"000002.txt", "too small"},
                                 {"000003.png", small_png(9, 9, 9)},
                                 {"000003.txt", " \n"},
                                 {"000004.png", small_png(9, 9, 9)}}));
    ms::ImageTextOptions options;
    options.min_side = 8;

    // 000004 has no caption: refused at open
    std::string error = error_of([&] { ms::open_webdataset({shard}, options); });
    EXPECT_NE(error.find(shard), std::string::npos) << error;
    EXPECT_NE(error.find("'000004'"), std::string::npos) << error;
    EXPECT_NE(error.find("no caption"), std::string::npos) << error;

    options.skip_bad_samples = true;
    const auto src = ms::open_webdataset({shard}, options);
    EXPECT_EQ(src->size(), 4);
    EXPECT_EQ(src->skipped(), 1);
    ms::ImageTextSample s;
    EXPECT_TRUE(src->read(0, 8, s));
    EXPECT_FALSE(src->read(1, 8, s));
    EXPECT_FALSE(src->read(2, 8, s));
    EXPECT_FALSE(src->read(3, 8, s));
    EXPECT_EQ(src->skipped(), 4);

    // without skipping, each read error names the shard, the key and what is wrong
    write_file(shard, tar_bytes({{"000001.png", corrupt},
                                 {"000001.txt", "corrupt image"},
                                 {"000002.png", small_png(0, 0, 255, 4)},
                                 {"000002.txt", "too small"},
                                 {"000003.png", small_png(9, 9, 9)},
                                 {"000003.txt", " \n"}}));
    options.skip_bad_samples = false;
    const auto strict = ms::open_webdataset({shard}, options);
    error = error_of([&] { strict->read(0, 8, s); });
    EXPECT_NE(error.find(shard), std::string::npos) << error;
    EXPECT_NE(error.find("'000001'"), std::string::npos) << error;
    EXPECT_NE(error.find("not a valid PNG"), std::string::npos) << error;
    error = error_of([&] { strict->read(1, 8, s); });
    EXPECT_NE(error.find("'000002'"), std::string::npos) << error;
    EXPECT_NE(error.find("4 x 4 pixels"), std::string::npos) << error;
    EXPECT_NE(error.find("smaller than the smallest side accepted, 8"), std::string::npos) << error;
    error = error_of([&] { strict->read(2, 8, s); });
    EXPECT_NE(error.find("caption (.txt) is empty"), std::string::npos) << error;
    EXPECT_EQ(strict->skipped(), 0);
}

TEST(ImageTextWebDataset, DamagedShardIsAnErrorOrKeepsTheSamplesBefore) {
    TempDir dir;
    const std::string whole = tar_bytes({{"000000.png", small_png(255, 0, 0)},
                                         {"000000.txt", "first"},
                                         {"000001.txt", "second"},
                                         {"000001.png", small_png(0, 255, 0)}});
    const std::string shard = dir / "shard-000.tar";
    write_file(shard, whole);
    const int64_t last_data = ms::read_tar_index(shard, "test tar", "none").members.back().offset;
    write_file(shard, whole.substr(0, static_cast<size_t>(last_data) + 10));  // cuts 000001.png's data
    const std::string error = error_of([&] { ms::open_webdataset({shard}, {}); });
    EXPECT_NE(error.find(shard), std::string::npos) << error;
    EXPECT_NE(error.find("truncated"), std::string::npos) << error;
    ms::ImageTextOptions skip;
    skip.skip_bad_samples = true;
    const auto src = ms::open_webdataset({shard}, skip);
    EXPECT_EQ(src->size(), 1);
    EXPECT_EQ(src->skipped(), 1);
    EXPECT_NE(src->describe().find("1 dropped at open (the first: shard-000.tar:000001: the shard is truncated"),
              std::string::npos)
        << src->describe();
    ms::ImageTextSample s;
    ASSERT_TRUE(src->read(0, 4, s));
    EXPECT_EQ(s.caption, "first");

    write_file(dir / "classes.txt", "zero\n");
    write_file(shard, tar_bytes({{"000000.png", small_png(1, 2, 3)}, {"000000.txt", "x"}, {"000000.cls", "5"}}));
    const std::string label_error = error_of([&] { ms::open_webdataset({shard}, {})->read(0, 4, s); });
    EXPECT_NE(label_error.find("its label (.cls) is 5, but"), std::string::npos) << label_error;
}

// ---- synthetic shapes ----

TEST(ImageTextSynthetic, DeterministicPerSeedAndSplit) {
    const auto a = ms::open_synthetic_shapes(7, 100, 0), b = ms::open_synthetic_shapes(7, 100, 0);
    const auto other_seed = ms::open_synthetic_shapes(8, 100, 0), held_out = ms::open_synthetic_shapes(7, 100, 1);
    ms::ImageTextSample x, y;
    int same_caption_other_seed = 0, same_caption_held_out = 0;
    for (int64_t i = 0; i < 20; ++i) {
        ASSERT_TRUE(a->read(i, 32, x));
        ASSERT_TRUE(b->read(i, 32, y));
        EXPECT_EQ(x.pixels, y.pixels) << i;  // bitwise
        EXPECT_EQ(x.caption, y.caption);
        ASSERT_TRUE(other_seed->read(i, 32, y));
        EXPECT_NE(x.pixels, y.pixels);
        same_caption_other_seed += x.caption == y.caption;
        ASSERT_TRUE(held_out->read(i, 32, y));
        EXPECT_NE(x.pixels, y.pixels);
        same_caption_held_out += x.caption == y.caption;
    }
    // 24 single-object classes and many more pairs: equal captions are chance coincidences
    EXPECT_LE(same_caption_other_seed, 3);
    EXPECT_LE(same_caption_held_out, 3);
    EXPECT_NE(a->fingerprint(), held_out->fingerprint());
    EXPECT_EQ(a->fingerprint(), b->fingerprint());
}

TEST(ImageTextSynthetic, CaptionsMatchLabelsAndObjectsAreVisible) {
    const auto src = ms::open_synthetic_shapes(3, 400, 0);
    const std::vector<std::string>& classes = src->classes();
    ASSERT_EQ(classes.size(), 24u);
    EXPECT_EQ(classes[0], "red circle");
    const std::regex two("a ([a-z]+ [a-z]+) (left of|above) a ([a-z]+ [a-z]+)");
    int single = 0;
    ms::ImageTextSample s;
    for (int64_t i = 0; i < src->size(); ++i) {
        ASSERT_TRUE(src->read(i, 32, s));
        if (s.label >= 0) {
            ++single;
            ASSERT_LT(s.label, 24);
            EXPECT_EQ(s.caption, "a " + classes[static_cast<size_t>(s.label)]) << i;
            if (classes[static_cast<size_t>(s.label)].rfind("red ", 0) == 0) {
                // red (0.86, 0.15, 0.15) +- 0.04 against a grey background <= 0.38: the smallest red shape (a
                // triangle of r = 0.18) covers about 60 pixels at S = 32, fewer at its antialiased edge
                int red = 0;
                for (int p = 0; p < 32 * 32; ++p) {
                    const float r = unnormalise(s.pixels, 32, 0, p / 32, p % 32) / 255;
                    const float g = unnormalise(s.pixels, 32, 1, p / 32, p % 32) / 255;
                    red += r > 0.75f && g < 0.25f;
                }
                EXPECT_GE(red, 30) << s.caption << " " << i;
            }
        } else {
            std::smatch m;
            ASSERT_TRUE(std::regex_match(s.caption, m, two)) << s.caption;
            EXPECT_NE(m[1].str(), m[3].str());
            EXPECT_NE(std::find(classes.begin(), classes.end(), m[1].str()), classes.end()) << s.caption;
            EXPECT_NE(std::find(classes.begin(), classes.end(), m[3].str()), classes.end()) << s.caption;
        }
    }
    // 70% single-object images: 400 draws put the count within +-5 standard deviations (9 each) of 280
    EXPECT_NEAR(single, 280, 46);
}

TEST(ImageTextSynthetic, ConcurrentReadsEqualSerialOnes) {
    const auto src = ms::open_synthetic_shapes(1, 64, 0);
    std::vector<ms::ImageTextSample> serial(64), parallel(64);
    for (int64_t i = 0; i < 64; ++i) src->read(i, 16, serial[static_cast<size_t>(i)]);
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
        threads.emplace_back([&, t] {
            for (int64_t i = t; i < 64; i += 4) src->read(i, 16, parallel[static_cast<size_t>(i)]);
        });
    }
    for (auto& th : threads) th.join();
    for (size_t i = 0; i < 64; ++i) EXPECT_EQ(serial[i].pixels, parallel[i].pixels) << i;
}

// ---- order ----

class FakeSource final : public ms::ImageTextSource {
  public:
    FakeSource(int64_t n, uint64_t fingerprint, std::string name) : n_(n), fp_(fingerprint), name_(std::move(name)) {}
    int64_t size() const override { return n_; }
    const std::vector<std::string>& classes() const override { return classes_; }
    bool read(int64_t, int, ms::ImageTextSample&) const override { return false; }
    int64_t skipped() const override { return 0; }
    std::string describe() const override { return name_; }
    uint64_t fingerprint() const override { return fp_; }

  private:
    int64_t n_;
    uint64_t fp_;
    std::string name_;
    std::vector<std::string> classes_;
};

TEST(ImageTextOrder, BijectionPerEpochFromSeedFingerprintAndIndexOnly) {
    const FakeSource src(1000, 42, "a"), same_fingerprint(1000, 42, "b"), other_fingerprint(1000, 43, "a");
    const ms::ImageTextOrder order(src, 5), again(same_fingerprint, 5), other_seed(src, 6),
        other_fp(other_fingerprint, 5);
    std::vector<int64_t> epoch0, epoch1;
    int differ_seed = 0, differ_fp = 0;
    for (int64_t g = 0; g < 2000; ++g) {
        const int64_t s = order.sample_at(g);
        ASSERT_GE(s, 0);
        ASSERT_LT(s, 1000);
        ASSERT_EQ(again.sample_at(g), s) << g;
        differ_seed += other_seed.sample_at(g) != s;
        differ_fp += other_fp.sample_at(g) != s;
        (g < 1000 ? epoch0 : epoch1).push_back(s);
    }
    EXPECT_EQ(std::set<int64_t>(epoch0.begin(), epoch0.end()).size(), 1000u);
    EXPECT_EQ(std::set<int64_t>(epoch1.begin(), epoch1.end()).size(), 1000u);
    EXPECT_NE(epoch0, epoch1);
    // independent permutations agree at a position with probability 1/1000
    EXPECT_GT(differ_seed, 1900);
    EXPECT_GT(differ_fp, 1900);
    // one sample: every position visits it
    const FakeSource one(1, 1, "one");
    EXPECT_EQ(ms::ImageTextOrder(one, 1).sample_at(12345), 0);
    const FakeSource empty(0, 1, "empty source");
    EXPECT_NE(error_of([&] { ms::ImageTextOrder(empty, 1); }).find("empty source has no samples"), std::string::npos);
}

}  // namespace
