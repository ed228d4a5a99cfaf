// safetensors.h: the Hugging Face safetensors format (docs/formats.md), written and read
// here without a dependency.
//
//   [8 bytes: N, u64 little-endian][N bytes: JSON header, padded with spaces to a multiple of 8][byte buffer]
//   header = {"__metadata__": {"k": "v", ...},                       optional, string -> string only
//             "NAME": {"dtype": "F32", "shape": [2, 3], "data_offsets": [BEGIN, END]}, ...}
//
// Offsets are relative to the byte buffer; END is one past the last byte. Tensor data is little-endian, C order.
//
// Writer: tensors ordered by descending element size, then by name (the Rust writer's order, tensor.rs:227-232;
// for single-dtype files that is plain name order). Because the header keeps the buffer 8-byte aligned and
// larger elements come first, every tensor starts at a multiple of its element size: data() of a file written
// here can be used as a typed pointer. Files from other writers may not be aligned; copy with memcpy then.
//
// Reader: validates as the Rust reference does (tensor.rs:392-425, :627-664) -- header length <= 100 MB and
// inside the file, header starts with '{' and is valid UTF-8 JSON without duplicate keys, known dtype,
// non-negative shape, END - BEGIN == numel * element size, tensors sorted by offset tile the byte buffer from 0
// with no hole or overlap, 8 + N + buffer length == file size. Every problem throws ms::UserError (exit code
// kExitCheckpoint) naming the file, the tensor and the problem.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/core/dtype.h"

namespace ms {

inline constexpr uint64_t kSafetensorsMaxHeader = 100'000'000;  // MAX_HEADER_SIZE, tensor.rs:10

struct TensorEntry {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;  // () for a scalar; a 0 anywhere makes an empty tensor
    const void* data;            // numel * dtype_size(dtype) bytes, C order; may be null when empty
};

// Writes `path` atomically (path.tmp, fsync, rename, fsync dir). Throws UserError (kExitCheckpoint) on I/O errors;
// a duplicate or empty name, the name "__metadata__" or a negative dimension is a programming error (MS_CHECK).
// on_written, if given, is called with each tensor's byte count once its data is written (progress).
void write_safetensors(const std::string& path, const std::vector<TensorEntry>& tensors,
                       const std::map<std::string, std::string>& metadata = {},
                       const std::function<void(uint64_t)>& on_written = {});

// "F32", "BF16", ... as the format spells the engine's types.
std::string_view safetensors_dtype(DType t);

struct TensorInfo {
    std::string dtype_name;      // as in the file: "F32", "BF16", "U8", "BOOL", ...
    std::optional<DType> dtype;  // the engine type, if it has one (F32, BF16, F16, I32, U16)
    std::vector<int64_t> shape;
    uint64_t begin = 0;  // data_offsets, relative to the byte buffer
    uint64_t end = 0;
    uint64_t nbytes() const { return end - begin; }
    int64_t numel() const;
};

// A validated, read-only view of a safetensors file: the file is mmapped (open) or copied (open_from_memory); the
// data() pointers live as long as the object.
class SafetensorsFile {
  public:
    static SafetensorsFile open(const std::string& path);
    // `label` names the source in error messages.
    static SafetensorsFile open_from_memory(std::string_view bytes, const std::string& label = "<memory>");

    SafetensorsFile(SafetensorsFile&&) noexcept;
    SafetensorsFile& operator=(SafetensorsFile&&) noexcept;
    ~SafetensorsFile();

    const std::string& path() const { return path_; }
    const std::vector<std::string>& names() const { return names_; }  // sorted
    bool contains(const std::string& name) const { return infos_.count(name) != 0; }
    const TensorInfo& info(const std::string& name) const;  // UserError if absent
    const std::byte* data(const std::string& name) const;   // info(name).nbytes() bytes
    const std::map<std::string, std::string>& metadata() const { return metadata_; }

  private:
    SafetensorsFile() = default;
    void parse();
    void release();

    std::string path_;
    const std::byte* bytes_ = nullptr;  // the whole file
    size_t size_ = 0;
    void* mapping_ = nullptr;             // mmap region (open), or null
    std::unique_ptr<std::byte[]> owned_;  // copy (open_from_memory), or null
    const std::byte* buffer_ = nullptr;   // the byte buffer after the header
    std::vector<std::string> names_;
    std::map<std::string, TensorInfo> infos_;
    std::map<std::string, std::string> metadata_;
};

}  // namespace ms
