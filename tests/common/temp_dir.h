// temp_dir.h: a fresh directory under $TMPDIR (mkdtemp) for one test, removed with everything in it at the end.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <string>

namespace ms::test {

class TempDir {
  public:
    explicit TempDir(const std::string& prefix = "ms_test") {
        const char* base = std::getenv("TMPDIR");
        std::string tmpl = std::string(base && *base ? base : "/tmp") + "/" + prefix + "_XXXXXX";
        char* p = ::mkdtemp(tmpl.data());
        if (!p) throw std::runtime_error("mkdtemp failed for " + tmpl);
        path_ = p;
    }
    ~TempDir() {
        std::error_code ec;
        std::filesystem::remove_all(path_, ec);
    }
    TempDir(const TempDir&) = delete;
    TempDir& operator=(const TempDir&) = delete;
    const std::string& path() const { return path_; }
    std::string operator/(const std::string& name) const { return path_ + "/" + name; }

  private:
    std::string path_;
};

}  // namespace ms::test
