// Writes the fuzz targets' seed corpora (tests/fuzz/corpus/<target>/):
// valid inputs of each kind, and a few near-valid ones, made with Monsoon's
// own writers so that they stay valid as the formats evolve. Run by
// `tools/fuzz.sh --write_seeds`.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/data_shape.h"
#include "common/model_config.h"
#include "common/onebit.h"
#include "proto/checkpoint.pb.h"
#include "proto/service.pb.h"
#include "server/checkpoint.h"

namespace {

constexpr int kShardSize = 1000;  // as the push fuzzers' shard
constexpr int kBucket = 64;

std::string dir;

void Write(const std::string& target, const std::string& name,
           const std::string& bytes) {
  const std::string path = dir + "/" + target + "/" + name;
  std::ofstream out(path, std::ios::binary);
  out << bytes;
  if (!out.good()) {
    std::fprintf(stderr, "make_seeds: cannot write %s\n", path.c_str());
    std::exit(1);
  }
}

// The push fuzzers' framing: a 2-byte little-endian prefix per message,
// its length in the low 14 bits, in how many more slices it is delivered
// in the top 2.
std::string Framed(const std::vector<monsoon::PushChunk>& chunks,
                   int more_slices = 0) {
  std::string out;
  for (const auto& chunk : chunks) {
    const std::string bytes = chunk.SerializeAsString();
    const size_t prefix = bytes.size() | (more_slices << 14);
    out += static_cast<char>(prefix & 0xff);
    out += static_cast<char>(prefix >> 8);
    out += bytes;
  }
  return out;
}

monsoon::PushHeader Header(monsoon::PushEncoding encoding) {
  monsoon::PushHeader header;
  header.set_worker_rank(1);
  header.set_shard(0);
  header.set_base_version(3);
  header.set_length(kShardSize);
  header.set_samples(8);
  header.set_sample_offset(24);
  header.set_encoding(encoding);
  if (encoding == monsoon::ENCODING_ONEBIT) header.set_bucket_size(kBucket);
  return header;
}

std::string Floats(const std::vector<float>& values, size_t begin, size_t end) {
  return std::string(reinterpret_cast<const char*>(values.data() + begin),
                     (end - begin) * sizeof(float));
}

void PushSeeds(const std::vector<float>& g) {
  monsoon::PushChunk whole;
  *whole.mutable_header() = Header(monsoon::ENCODING_FLOAT32);
  whole.set_data(Floats(g, 0, kShardSize));
  Write("push_decoder", "one_chunk", Framed({whole}));
  monsoon::PushChunk first = whole, second;
  first.set_data(Floats(g, 0, 600));
  second.set_offset(600);
  second.set_data(Floats(g, 600, kShardSize));
  Write("push_decoder", "two_chunks", Framed({first, second}));
  Write("push_decoder", "two_chunks_in_slices", Framed({first, second}, 3));
  std::vector<float> bad = g;
  bad[700] = std::nanf("");
  second.set_data(Floats(bad, 600, kShardSize));
  Write("push_decoder", "nan_in_second_chunk", Framed({first, second}));
  Write("push_decoder", "short", Framed({first}));
}

void OneBitSeeds(const std::vector<float>& g) {
  auto encoded = [&](size_t begin, size_t end) {
    std::vector<float> residual(end - begin, 0.0f);
    monsoon::common::OneBitEncoded out;
    monsoon::common::OneBitEncode(
        absl::MakeConstSpan(g.data() + begin, end - begin),
        absl::MakeSpan(residual), kBucket, &out);
    return out;
  };
  monsoon::PushChunk whole;
  *whole.mutable_header() = Header(monsoon::ENCODING_ONEBIT);
  monsoon::common::OneBitEncoded all = encoded(0, kShardSize);
  whole.set_data(all.bits);
  whole.set_scales(all.scales);
  Write("onebit_push", "one_chunk", Framed({whole}));
  // Chunks hold whole buckets: 8 buckets (512 values), then the rest.
  monsoon::PushChunk first, second;
  *first.mutable_header() = Header(monsoon::ENCODING_ONEBIT);
  monsoon::common::OneBitEncoded a = encoded(0, 512),
                                 b = encoded(512, kShardSize);
  first.set_data(a.bits);
  first.set_scales(a.scales);
  second.set_offset(512);
  second.set_data(b.bits);
  second.set_scales(b.scales);
  Write("onebit_push", "two_chunks", Framed({first, second}));
  Write("onebit_push", "two_chunks_in_slices", Framed({first, second}, 2));
  Write("onebit_push", "short", Framed({first}));
  std::string scales = b.scales;
  const float inf = INFINITY;
  std::memcpy(scales.data() + 4, &inf, sizeof(inf));
  second.set_scales(scales);
  Write("onebit_push", "infinite_scale", Framed({first, second}));
}

void ConfigSeeds() {
  const char* texts[] = {
      "",
      "layer_sizes: [6, 5, 3] mode: DOWNPOUR optimizer: ADAGRAD "
      "learning_rate: 0.5 batch_size: 8 n_push: 2 n_fetch: 3",
      "mode: SYNC epochs: 1 momentum: 0.9 compression: COMPRESSION_ONEBIT "
      "onebit_bucket_size: 128",
      "mode: EASGD tau: 4 alpha: 0.5 local_learning_rate: 0.05",
      "mode: HOGWILD chunk_bytes: 262144 seed: 7 sync_timeout_s: 30",
      "model: LENET mode: DOWNPOUR",
      "layers { conv { filters: 4 kernel: 3 stride: 2 padding: 1 } } "
      "layers { relu {} } layers { max_pool { size: 3 stride: 1 } } "
      "layers { flatten {} } layers { dense {} } input_shape: [9, 7, 2] "
      "num_classes: 3",
      "layers { dense { units: 32 } } layers { relu {} } layers { dense {} }",
  };
  int i = 0;
  for (const char* text : texts) {
    auto parsed = monsoon::common::ParseConfigText(text);
    if (!parsed.ok()) {
      std::fprintf(stderr, "make_seeds: seed config %d: %s\n", i,
                   parsed.status().ToString().c_str());
      std::exit(1);
    }
    Write("config", "config_" + std::to_string(i++), text);
    monsoon::common::DataShape data;
    data.example = {28, 28, 1};
    data.num_classes = 10;
    auto resolved = monsoon::common::ResolveConfig(
        *parsed, monsoon::common::ModelNeedsData(*parsed) ? &data : nullptr);
    if (resolved.ok()) {
      Write("config", "resolved_" + std::to_string(i),
            monsoon::common::ConfigToText(*resolved));
    }
  }
}

// Shard 1 of 2 of 53 parameters (27), as checkpoint_fuzzer checks against.
void CheckpointSeeds(const std::vector<float>& g) {
  constexpr int kWeights = 27;
  monsoon::ShardCheckpoint checkpoint;
  checkpoint.set_format_version(monsoon::server::kCheckpointFormatVersion);
  checkpoint.set_config_fingerprint(0x0123456789abcdefu);
  checkpoint.set_shard(1);
  checkpoint.set_num_shards(2);
  checkpoint.set_version(42);
  checkpoint.set_offset(26);
  checkpoint.set_weights(Floats(g, 0, kWeights));
  checkpoint.set_optimizer("sgd");
  checkpoint.set_optimizer_state(Floats(g, kWeights, 2 * kWeights));
  monsoon::StatsResponse* stats = checkpoint.mutable_stats();
  stats->set_shard(1);
  stats->set_version(42);
  stats->set_pushes(84);
  stats->add_staleness_counts(80);
  stats->add_staleness_counts(4);
  (*stats->mutable_samples_applied_by_worker())[0] = 336;
  (*stats->mutable_sample_position_by_worker())[0] = 336;
  const std::string path = dir + "/checkpoint/shard-1-of-2.ckpt";
  absl::Status written = monsoon::server::WriteCheckpoint(path, checkpoint);
  if (!written.ok()) {
    std::fprintf(stderr, "make_seeds: %s\n", written.ToString().c_str());
    std::exit(1);
  }
  // Format 1 (no CRC), Adagrad: positive accumulators.
  checkpoint.set_format_version(1);
  checkpoint.set_optimizer("adagrad");
  std::vector<float> accumulators(kWeights);
  for (int i = 0; i < kWeights; ++i) accumulators[i] = 0.1f + g[i] * g[i];
  checkpoint.set_optimizer_state(Floats(accumulators, 0, kWeights));
  Write("checkpoint", "format-1-adagrad", checkpoint.SerializeAsString());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_seeds CORPUS_DIR\n");
    return 2;
  }
  dir = argv[1];
  std::vector<float> g(kShardSize);
  for (int i = 0; i < kShardSize; ++i) g[i] = std::sin(0.37f * i) * 0.01f;
  PushSeeds(g);
  OneBitSeeds(g);
  ConfigSeeds();
  CheckpointSeeds(g);
  return 0;
}
