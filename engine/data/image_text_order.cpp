// image_text_order.cpp: the order image-text samples are visited in (image_text.h, epoch_order.h).
#include "engine/core/check.h"
#include "engine/core/philox.h"
#include "engine/data/image_text.h"

namespace ms {

ImageTextOrder::ImageTextOrder(const ImageTextSource& source, uint64_t seed) {
    if (source.size() < 1) {
        throw UserError(fmt::format("data error: {} has no samples to visit; hint: give it data", source.describe()));
    }
    order_ = EpochOrder(source.size(), seed, source.fingerprint(), name_hash("image-text order"));
}

}  // namespace ms
