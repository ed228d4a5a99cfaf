// image_decode.cpp: PNG (libpng) and JPEG (libjpeg-turbo) bytes -> 8-bit RGB (image_ops.h).
//
// Both libraries report a fatal error by calling an error handler that must not return; ours longjmps back into a
// small guard function (png_guarded, jpeg_guarded) whose only locals are trivial. Each decode is split into steps
// run under that guard, with the C++ work (checks, allocating the output) between them, so a longjmp never skips a
// destructor. The library handles are owned by RAII holders declared outside the guards; they free everything on
// every path. Nothing here prints or exits: warnings are swallowed (PNG) or recorded (JPEG, where a premature end of
// data is reported as a warning and treated as an error).
#include <jerror.h>
#include <png.h>

#include <algorithm>
#include <csetjmp>
#include <cstdio>
#include <cstring>
// jpeglib.h needs FILE and size_t declared before it
#include <jpeglib.h>

#include "engine/data/image_ops.h"

namespace ms {
namespace {

std::string too_large(int64_t width, int64_t height) {
    return "it is " + std::to_string(width) + " x " + std::to_string(height) + " pixels, more than the " +
           std::to_string(kMaxImagePixels) + " decoded at most";
}

// ---- PNG ----

struct PngInput {
    const uint8_t* data;
    size_t size;
    size_t pos;
};

struct PngJob {
    png_structp png;
    png_infop info;
    png_bytep* rows;  // (height) pointers into the output, set between the header and image steps
    char message[256];
};

void png_on_error(png_structp png, png_const_charp msg) {
    auto* job = static_cast<PngJob*>(png_get_error_ptr(png));
    std::snprintf(job->message, sizeof job->message, "%s", msg);
    png_longjmp(png, 1);
}

void png_on_warning(png_structp, png_const_charp) {}

void png_read_bytes(png_structp png, png_bytep out, size_t n) {
    auto* in = static_cast<PngInput*>(png_get_io_ptr(png));
    if (n > in->size - in->pos) png_error(png, "the file ends early (truncated)");
    std::memcpy(out, in->data + in->pos, n);
    in->pos += n;
}

bool png_guarded(PngJob& job, void (*step)(PngJob&)) {
    if (setjmp(png_jmpbuf(job.png))) return false;
    step(job);
    return true;
}

// Reads the header and asks for 8-bit RGB whatever the file holds (PIL's convert("RGB")).
void png_header_step(PngJob& job) {
    png_read_info(job.png, job.info);
    const int color = png_get_color_type(job.png, job.info);
    const int depth = png_get_bit_depth(job.png, job.info);
    if (depth == 16) png_set_strip_16(job.png);
    if (color == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(job.png);
    if ((color & PNG_COLOR_MASK_COLOR) == 0 && depth < 8) png_set_expand_gray_1_2_4_to_8(job.png);
    if ((color & PNG_COLOR_MASK_COLOR) == 0) png_set_gray_to_rgb(job.png);
    png_set_strip_alpha(job.png);  // also the alpha a palette's tRNS expands to
    png_set_interlace_handling(job.png);
    png_read_update_info(job.png, job.info);
}

void png_image_step(PngJob& job) { png_read_image(job.png, job.rows); }

struct PngHolder {
    png_structp png = nullptr;
    png_infop info = nullptr;
    ~PngHolder() { png_destroy_read_struct(&png, info ? &info : nullptr, nullptr); }
};

bool decode_png(const uint8_t* data, size_t size, RgbImage& out, std::string& error) {
    PngJob job{};
    PngInput input{data, size, 0};
    PngHolder holder;
    holder.png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &job, png_on_error, png_on_warning);
    if (holder.png != nullptr) holder.info = png_create_info_struct(holder.png);
    if (holder.info == nullptr) {
        error = "not decoded: libpng could not allocate its state";
        return false;
    }
    job.png = holder.png;
    job.info = holder.info;
    png_set_read_fn(job.png, &input, png_read_bytes);
    auto failed = [&] {
        error = std::string("not a valid PNG: ") + job.message;
        return false;
    };
    if (!png_guarded(job, png_header_step)) return failed();

    const int64_t width = png_get_image_width(job.png, job.info), height = png_get_image_height(job.png, job.info);
    if (width * height > kMaxImagePixels) {
        error = too_large(width, height);
        return false;
    }
    if (png_get_channels(job.png, job.info) != 3 || png_get_bit_depth(job.png, job.info) != 8 ||
        png_get_rowbytes(job.png, job.info) != static_cast<size_t>(width) * 3) {
        error = "not decoded: libpng did not convert this PNG's colour type to 8-bit RGB";
        return false;
    }
    out.width = out.source_width = static_cast<int>(width);
    out.height = out.source_height = static_cast<int>(height);
    out.pixels.resize(static_cast<size_t>(width * height * 3));
    std::vector<png_bytep> rows(static_cast<size_t>(height));
    for (int64_t y = 0; y < height; ++y) rows[static_cast<size_t>(y)] = out.pixels.data() + y * width * 3;
    job.rows = rows.data();
    if (!png_guarded(job, png_image_step)) return failed();
    return true;
}

// ---- JPEG ----

struct JpegJob {
    jpeg_decompress_struct cinfo;
    jpeg_error_mgr mgr;
    std::jmp_buf jump;
    const uint8_t* data;
    size_t size;
    uint8_t* pixels;  // (output_height, output_width, 3), set between the start and scanline steps
    bool created;
    bool truncated;  // libjpeg's "premature end of JPEG file" warning: it filled the rest with grey
    char message[JMSG_LENGTH_MAX];
};

void jpeg_on_error(j_common_ptr c) {
    auto* job = reinterpret_cast<JpegJob*>(c->client_data);
    (*c->err->format_message)(c, job->message);
    std::longjmp(job->jump, 1);
}

void jpeg_on_message(j_common_ptr c, int level) {
    if (level >= 0) return;  // trace messages
    auto* job = reinterpret_cast<JpegJob*>(c->client_data);
    if (c->err->msg_code == JWRN_JPEG_EOF && !job->truncated) {
        job->truncated = true;
        (*c->err->format_message)(c, job->message);
    }
}

void jpeg_on_output(j_common_ptr) {}

bool jpeg_guarded(JpegJob& job, void (*step)(JpegJob&)) {
    if (setjmp(job.jump)) return false;
    step(job);
    return true;
}

void jpeg_create_step(JpegJob& job) {
    jpeg_create_decompress(&job.cinfo);
    job.created = true;
    job.cinfo.client_data = &job;
}

void jpeg_header_step(JpegJob& job) {
    jpeg_mem_src(&job.cinfo, job.data, static_cast<unsigned long>(job.size));
    jpeg_read_header(&job.cinfo, TRUE);
}

void jpeg_start_step(JpegJob& job) { jpeg_start_decompress(&job.cinfo); }

void jpeg_scanlines_step(JpegJob& job) {
    const size_t stride = static_cast<size_t>(job.cinfo.output_width) * 3;
    while (job.cinfo.output_scanline < job.cinfo.output_height) {
        JSAMPROW row = job.pixels + job.cinfo.output_scanline * stride;
        jpeg_read_scanlines(&job.cinfo, &row, 1);
    }
    jpeg_finish_decompress(&job.cinfo);
}

struct JpegHolder {
    JpegJob job{};
    ~JpegHolder() {
        if (job.created) jpeg_destroy_decompress(&job.cinfo);
    }
};

bool decode_jpeg(const uint8_t* data, size_t size, int min_decoded_side, RgbImage& out, std::string& error) {
    JpegHolder holder;
    JpegJob& job = holder.job;
    job.cinfo.err = jpeg_std_error(&job.mgr);
    job.mgr.error_exit = jpeg_on_error;
    job.mgr.emit_message = jpeg_on_message;
    job.mgr.output_message = jpeg_on_output;
    job.cinfo.client_data = &job;
    job.data = data;
    job.size = size;
    auto failed = [&] {
        error = std::string("not a valid JPEG: ") + job.message;
        return false;
    };
    if (!jpeg_guarded(job, jpeg_create_step) || !jpeg_guarded(job, jpeg_header_step)) return failed();

    const int64_t width = job.cinfo.image_width, height = job.cinfo.image_height;
    if (width * height > kMaxImagePixels) {
        error = too_large(width, height);
        return false;
    }
    if (job.cinfo.num_components == 4) {
        error = "a CMYK JPEG, which is not decoded; hint: convert it to RGB";
        return false;
    }
    job.cinfo.out_color_space = JCS_RGB;
    const int64_t shorter = std::min(width, height);
    unsigned denom = 1;
    while (denom < 8 && min_decoded_side > 0 && shorter / (2 * denom) >= min_decoded_side) denom *= 2;
    job.cinfo.scale_num = 1;
    job.cinfo.scale_denom = denom;
    if (!jpeg_guarded(job, jpeg_start_step)) return failed();
    if (job.cinfo.output_components != 3) {
        error = "not decoded: libjpeg did not convert this JPEG's colour space to RGB";
        return false;
    }
    out.source_width = static_cast<int>(width);
    out.source_height = static_cast<int>(height);
    out.width = static_cast<int>(job.cinfo.output_width);
    out.height = static_cast<int>(job.cinfo.output_height);
    out.pixels.resize(static_cast<size_t>(out.width) * out.height * 3);
    job.pixels = out.pixels.data();
    if (!jpeg_guarded(job, jpeg_scanlines_step)) return failed();
    if (job.truncated) return failed();
    return true;
}

}  // namespace

bool decode_image(const uint8_t* data, size_t size, int min_decoded_side, RgbImage& out, std::string& error) {
    static constexpr uint8_t kPng[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
    auto starts_with = [&](const void* magic, size_t n, size_t at = 0) {
        return size >= at + n && std::memcmp(data + at, magic, n) == 0;
    };
    if (starts_with(kPng, 8)) return decode_png(data, size, out, error);
    if (starts_with("\xFF\xD8\xFF", 3)) return decode_jpeg(data, size, min_decoded_side, out, error);
    if (starts_with("GIF8", 4)) {
        error = "a GIF, which is not decoded (PNG and JPEG are); hint: convert it to PNG";
    } else if (starts_with("RIFF", 4) && starts_with("WEBP", 4, 8)) {
        error = "a WebP image, which is not decoded (PNG and JPEG are); hint: convert it to PNG or JPEG";
    } else if (size == 0) {
        error = "empty (0 bytes)";
    } else {
        char head[96];
        const size_t n = std::min<size_t>(size, 4);
        int len = std::snprintf(head, sizeof head, "neither a PNG nor a JPEG (it starts with the bytes");
        for (size_t k = 0; k < n; ++k) len += std::snprintf(head + len, sizeof head - len, " %02x", data[k]);
        error = std::string(head) + ")";
    }
    return false;
}

}  // namespace ms
