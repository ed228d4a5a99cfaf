// binary_files.h: raw little-endian arrays to and from files, for the tests that hand data to a Python reference and
// read its results back (tests/model/test_clip_hf.cpp, test_gpt_vs_torch.cpp, tests/unit/test_contrastive_loss.cpp).
// Header-only.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <fstream>
#include <string>
#include <vector>

#include "engine/core/check.h"

namespace ms::test {

inline void write_bin(const std::string& path, const void* data, size_t bytes) {
    std::ofstream f(path, std::ios::binary);
    f.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
    MS_CHECK(f.good(), "cannot write {}", path);
}

template <typename T>
void write_bin(const std::string& path, const std::vector<T>& v) {
    write_bin(path, v.data(), v.size() * sizeof(T));
}

// `count` values of T: a failure unless the file holds exactly that many.
template <typename T>
std::vector<T> read_bin(const std::string& path, size_t count) {
    std::vector<T> v(count);
    std::ifstream f(path, std::ios::binary);
    f.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(count * sizeof(T)));
    EXPECT_TRUE(f.good() && f.peek() == EOF) << path << " does not hold exactly " << count << " values";
    return v;
}

}  // namespace ms::test
