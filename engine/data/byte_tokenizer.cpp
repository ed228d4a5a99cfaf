// byte_tokenizer.cpp: the built-in byte-level tokenizer (`preprocess` writes its datasets: preprocess.cpp).
//
// Tokens: ids 0..255 are the bytes of the text, 256 (kByteEod) ends a document; vocabulary 257.
// preprocess.cpp cuts a text file into documents and writes them with this tokenizer's EOD after each.
#include "engine/data/dataset.h"

namespace ms {

std::vector<int32_t> byte_encode(const std::string& text) {
    std::vector<int32_t> ids(text.size());
    for (size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<uint8_t>(text[i]);
    return ids;
}

std::string byte_decode(const std::vector<int32_t>& ids) {
    std::string text;
    text.reserve(ids.size());
    for (int32_t id : ids) {
        if (id >= 0 && id < 256) {
            text += static_cast<char>(static_cast<uint8_t>(id));
        } else {
            text += id == kByteEod ? '\n' : '?';
        }
    }
    return text;
}

}  // namespace ms
