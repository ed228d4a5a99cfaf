// image_ops.h: the image pipeline behind image_text.h's sources: decode PNG/JPEG bytes to 8-bit RGB, then resize
// the shorter side to S, centre-crop and normalise into a (3, S, S) float image.
//
// Decoding never throws and never exits: libpng and libjpeg report errors through setjmp/longjmp inside the
// decoder, which frees everything and returns the library's message, and the caller turns it into a sentence that
// names the sample. Conversions follow PIL's Image.convert("RGB"): grey is replicated, palettes are expanded,
// alpha (and a tRNS transparency) is dropped, 16-bit samples keep their high byte.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace ms {

// Images with more pixels than this are refused before anything is allocated (decompression bombs).
inline constexpr int64_t kMaxImagePixels = int64_t{1} << 28;

struct RgbImage {
    int width = 0, height = 0;                // as decoded (a JPEG may be decoded at 1/2, 1/4 or 1/8 size)
    int source_width = 0, source_height = 0;  // as stored in the file
    std::vector<uint8_t> pixels;              // (height, width, 3) row-major RGB
};

// Decodes a PNG or JPEG (told apart by their signatures) into out. A JPEG whose shorter side is at least twice
// min_decoded_side is decoded at the smallest of 1/2, 1/4, 1/8 size that keeps the shorter side >= min_decoded_side
// (libjpeg's scaled IDCT, as PIL's draft mode); pass 0 to decode at full size. Returns false with a sentence fragment
// in error ("not a valid PNG: IDAT: CRC error") when the bytes are not a decodable image.
bool decode_image(const uint8_t* data, size_t size, int min_decoded_side, RgbImage& out, std::string& error);

// Resizes image so that its shorter side is S (separable triangle filter, widened by the shrink factor so that
// shrinking averages every source pixel, as PIL's bilinear resize), centre-crops S x S, and writes
// (x / 255 - kClipMean[c]) / kClipStd[c] into out, a (3, S, S) channel-major buffer.
void resize_crop_normalize(const RgbImage& image, int S, float* out);

}  // namespace ms
