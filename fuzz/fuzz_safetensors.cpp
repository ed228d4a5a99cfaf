// fuzz_safetensors.cpp: libFuzzer target for engine/ckpt/safetensors' reader. Any input must either open or be
// rejected with ms::UserError -- no crash, no sanitizer report, no other exception. Two ways to read the input:
//
//   byte 0 even   the rest is the whole file, verbatim (length prefix, header and buffer all fuzzed)
//   byte 0 odd    the rest minus its last 2 bytes is the JSON header; the file is built as u64le(header size) +
//                 header + (u16 of the last 2 bytes % 4096) zero bytes, so mutations reach the header rules
//                 without first having to guess a consistent length prefix
//
// When a file opens, the reader's promises are checked: names sorted and unique, each tensor's bytes inside the
// input and of numel * element size, all tensors together exactly the bytes after the header; every data byte is
// read, so ASan sees any pointer outside the (exact-size) copy. A broken promise is __builtin_trap().
//
// Build and run (Clang only; see the top-level CMakeLists.txt):
//   CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DMS_BUILD_FUZZERS=ON -DMS_ENABLE_CUDA=OFF
//   ninja -C build-fuzz fuzz_safetensors && ./build-fuzz/fuzz_safetensors -max_total_time=20
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "engine/ckpt/safetensors.h"
#include "engine/core/check.h"

namespace {

#define FUZZ_CHECK(cond)               \
    do {                               \
        if (!(cond)) __builtin_trap(); \
    } while (0)

std::string build_input(const uint8_t* data, size_t size) {
    if (size == 0) return {};
    if ((data[0] & 1) == 0) return std::string(reinterpret_cast<const char*>(data + 1), size - 1);
    if (size < 3) return {};
    const size_t header_len = size - 3;
    const size_t buffer_len = (size_t{data[size - 2]} << 8 | data[size - 1]) % 4096;
    std::string file(8, '\0');
    for (int i = 0; i < 8; ++i) file[i] = static_cast<char>(uint64_t{header_len} >> (8 * i));
    file.append(reinterpret_cast<const char*>(data + 1), header_len);
    file.append(buffer_len, '\0');
    return file;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string file = build_input(data, size);
    try {
        const ms::SafetensorsFile f = ms::SafetensorsFile::open_from_memory(file, "fuzz");
        uint64_t header_len = 0;
        std::memcpy(&header_len, file.data(), 8);
        const uint64_t buffer_len = file.size() - 8 - header_len;
        uint64_t covered = 0;
        unsigned sink = 0;
        const std::string* prev = nullptr;
        for (const std::string& name : f.names()) {
            FUZZ_CHECK(prev == nullptr || *prev < name);
            prev = &name;
            const ms::TensorInfo& info = f.info(name);
            FUZZ_CHECK(info.begin <= info.end && info.end <= buffer_len);
            if (info.dtype) FUZZ_CHECK(info.nbytes() == uint64_t(info.numel()) * ms::dtype_size(*info.dtype));
            covered += info.nbytes();
            const std::byte* p = f.data(name);
            for (uint64_t i = 0; i < info.nbytes(); ++i) sink += static_cast<unsigned>(p[i]);
        }
        FUZZ_CHECK(covered == buffer_len);
        for (const auto& [k, v] : f.metadata()) sink += static_cast<unsigned>(k.size() + v.size());
        asm volatile("" : : "r"(sink));
    } catch (const ms::UserError&) {
        // the only acceptable failure
    }
    return 0;
}
