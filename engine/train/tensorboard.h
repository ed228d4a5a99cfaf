// tensorboard.h: logging.tensorboard_dir -- TensorBoard event files written natively by the logging rank, with no
// TensorFlow or protobuf library.
//
// An event file is a sequence of TFRecords, each
//   uint64 length | uint32 masked CRC-32C of the 8 length bytes | data | uint32 masked CRC-32C of the data
// (integers little-endian; mask(c) = ((c >> 15) | (c << 17)) + 0xa282ead8), whose data is one serialized
// tensorflow.Event protobuf, encoded here by hand from the fields we use:
//   Event       1 wall_time (double)  2 step (int64)  3 file_version (string)  5 summary  7 session_log
//   Summary     1 value (repeated)
//   Value       1 tag (string)  2 simple_value (float)
//   SessionLog  1 status (enum; START = 1)
// A file opens with the event file_version "brain.Event:2", then a SessionLog START at the run's first step: for a
// file of version 2 TensorBoard drops every event of the directory's earlier files at or past that step, so a resumed
// run replaces what a crashed run logged past its checkpoint instead of drawing it twice. Every run (and every resume)
// writes a new file, events.out.tfevents.<10-digit unix time>.<host>[.N]; TensorBoard reads all files of a directory
// in name order, and no file of an earlier run is ever opened for writing.
//
// The scalars are those of the metrics.jsonl records (engine/train/trainer.cpp writes one record per log interval
// and per validation): tensorboard_scalars() maps a record to them, under Megatron's tag names where Megatron logs
// the same quantity.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace ms {

// CRC-32C (Castagnoli, reflected polynomial 0x82f63b78, as iSCSI and TFRecord use it) and TFRecord's mask of it.
uint32_t crc32c(std::string_view data);
uint32_t masked_crc32c(std::string_view data);

// One TFRecord holding `data`.
std::string tfrecord(std::string_view data);

// Serialized Event protobufs.
std::string file_version_event(double wall_time);
std::string session_start_event(double wall_time, int64_t step);
std::string scalar_event(double wall_time, int64_t step, std::string_view tag, float value);

struct TensorBoardScalar {
    std::string tag;
    int64_t step = 0;
    double value = 0;
};

// The scalars of one metrics.jsonl record: every number in it under its key (nested objects as "outer/inner") at
// step "iteration", except "iteration" and "time" themselves; Megatron's "lm loss validation" for our "validation lm
// loss", and its "lm loss validation ppl". Nulls (a loss or norm that was not finite) are left out. Megatron's
// "<tag> vs samples" series are not written: their steps are sample counts, which the SessionLog START of a resume
// (at an iteration) would purge; "consumed_samples" is a series of its own.
std::vector<TensorBoardScalar> tensorboard_scalars(const nlohmann::json& record);

class TensorBoardWriter {
  public:
    // Creates `dir` when missing and a new event file in it; writes the file version and a SessionLog START at
    // first_step. Throws UserError when the directory or the file cannot be made.
    TensorBoardWriter(const std::string& dir, int64_t first_step);
    ~TensorBoardWriter();
    TensorBoardWriter(const TensorBoardWriter&) = delete;
    TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

    // The record's scalars (tensorboard_scalars), at its "time" (or now), flushed so TensorBoard sees them live.
    void add_record(const nlohmann::json& record);

    const std::string& path() const { return path_; }

  private:
    void write(const std::string& event);

    std::string path_;
    std::FILE* file_ = nullptr;
};

}  // namespace ms
