#include "common/config.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <google/protobuf/text_format.h>

#include <algorithm>
#include <array>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/model_config.h"

namespace monsoon::common {
namespace {

// Names longer than this are no field's or value's: not compared.
constexpr size_t kLongestName = 64;

// The edit distance between a and b, letters compared whatever their case
// (insertions, deletions and substitutions of one character each), or
// `limit` when it is `limit` or more (found out early: a row whose least
// value has reached it); b at most kLongestName characters.
size_t EditDistance(absl::string_view a, absl::string_view b, size_t limit) {
  std::array<size_t, kLongestName + 1> row;
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    size_t least = row[0];
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      const bool same =
          absl::ascii_tolower(a[i - 1]) == absl::ascii_tolower(b[j - 1]);
      row[j] =
          std::min({row[j] + 1, row[j - 1] + 1, diagonal + (same ? 0 : 1)});
      least = std::min(least, row[j]);
      diagonal = above;
    }
    if (least >= limit) return limit;
  }
  return std::min(row[b.size()], limit);
}

// Of the `count` names name(0), name(1), ..., the one closest to `typed` (a
// typo: at most a third of its length apart, and at least 1 character), or
// "" when none is that close.
template <typename Name>
std::string Closest(absl::string_view typed, int count, Name name) {
  std::string best;
  if (typed.size() > kLongestName) return best;
  size_t best_distance = std::max<size_t>(1, typed.size() / 3) + 1;
  for (int i = 0; i < count; ++i) {
    const std::string& candidate = name(i);
    if (candidate.size() > kLongestName) continue;
    // Lengths further apart than that are no typo (and a long name, which
    // no field has, costs no comparisons).
    const size_t apart = candidate.size() > typed.size()
                             ? candidate.size() - typed.size()
                             : typed.size() - candidate.size();
    if (apart >= best_distance) continue;
    const size_t distance = EditDistance(typed, candidate, best_distance);
    if (distance < best_distance) {
      best = candidate;
      best_distance = distance;
    }
  }
  return best;
}

// The enum field `name` of TrainingConfig or of a message within it.
const google::protobuf::FieldDescriptor* FindEnumField(
    const google::protobuf::Descriptor* descriptor, absl::string_view name,
    int depth = 0) {
  for (int i = 0; i < descriptor->field_count(); ++i) {
    const google::protobuf::FieldDescriptor* field = descriptor->field(i);
    if (field->name() == name && field->enum_type() != nullptr) return field;
    if (field->message_type() != nullptr && depth < 3) {
      const google::protobuf::FieldDescriptor* found =
          FindEnumField(field->message_type(), name, depth + 1);
      if (found != nullptr) return found;
    }
  }
  return nullptr;
}

// For the text-format parser's "no such field" and "no such enum value"
// errors, the field or value meant, if one is a typo away: " Did you mean
// \"learning_rate\"?"; else "".
std::string Suggestion(absl::string_view message) {
  // 'Message type "T" has no field named "F".' and 'Unknown enumeration
  // value of "V" for field "F".', split at their quotes.
  const std::vector<absl::string_view> parts = absl::StrSplit(message, '"');
  if (parts.size() != 5) return "";
  std::string closest;
  if (parts[0] == "Message type " && parts[2] == " has no field named ") {
    const google::protobuf::Descriptor* descriptor =
        google::protobuf::DescriptorPool::generated_pool()
            ->FindMessageTypeByName(std::string(parts[1]));
    if (descriptor == nullptr) return "";
    closest = Closest(parts[3], descriptor->field_count(),
                      [&](int i) -> const std::string& {
                        return descriptor->field(i)->name();
                      });
  } else if (parts[0] == "Unknown enumeration value of " &&
             parts[2] == " for field ") {
    const google::protobuf::FieldDescriptor* field =
        FindEnumField(TrainingConfig::descriptor(), parts[3]);
    if (field == nullptr) return "";
    const google::protobuf::EnumDescriptor* values = field->enum_type();
    closest = Closest(
        parts[1], values->value_count(),
        [&](int i) -> const std::string& { return values->value(i)->name(); });
  }
  return closest.empty() ? ""
                         : absl::StrCat(" Did you mean \"", closest, "\"?");
}

// Collects parser errors so that the message names the line and column.
class ErrorCollector : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, int column, const std::string& message) override {
    if (!errors_.empty()) errors_ += "; ";
    absl::StrAppend(&errors_, "line ", line + 1, " column ", column + 1, ": ",
                    message, Suggestion(message));
  }
  const std::string& errors() const { return errors_; }

 private:
  std::string errors_;
};

}  // namespace

absl::StatusOr<TrainingConfig> ParseConfigText(absl::string_view text) {
  TrainingConfig config;
  google::protobuf::TextFormat::Parser parser;
  ErrorCollector errors;
  parser.RecordErrorsTo(&errors);
  if (!parser.ParseFromString(std::string(text), &config)) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot parse the training config (text-format "
                     "monsoon.TrainingConfig): ",
                     errors.errors()));
  }
  return config;
}

absl::StatusOr<TrainingConfig> LoadConfigFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return absl::NotFoundError(absl::StrCat(
        "cannot read the config file '", path, "': check the --config path"));
  }
  std::stringstream buffer;
  buffer << in.rdbuf();
  absl::StatusOr<TrainingConfig> config = ParseConfigText(buffer.str());
  if (!config.ok()) {
    return absl::Status(config.status().code(),
                        absl::StrCat(path, ": ", config.status().message()));
  }
  return config;
}

absl::StatusOr<TrainingConfig> LoadResolvedConfig(const std::string& path,
                                                  const std::string& data_dir) {
  TrainingConfig raw;
  if (!path.empty()) {
    absl::StatusOr<TrainingConfig> loaded = LoadConfigFile(path);
    if (!loaded.ok()) return loaded.status();
    raw = *std::move(loaded);
  }
  if (!data_dir.empty()) raw.set_data_dir(data_dir);
  absl::StatusOr<TrainingConfig> resolved = ResolveConfigWithData(raw);
  if (!resolved.ok() && !path.empty()) {
    return absl::Status(resolved.status().code(),
                        absl::StrCat(path, ": ", resolved.status().message()));
  }
  return resolved;
}

absl::StatusOr<TrainingConfig> ResolveConfigWithData(
    const TrainingConfig& config) {
  if (!ModelNeedsData(config)) return ResolveConfig(config);
  absl::StatusOr<DataShape> data = ReadDataShape(config.data_dir());
  if (!data.ok()) {
    return absl::Status(
        data.status().code(),
        absl::StrCat("the model takes its input shape and classes from the "
                     "training data, which cannot be read (or set "
                     "input_shape and num_classes in the config): ",
                     data.status().message()));
  }
  return ResolveConfig(config, &*data);
}

namespace {

// `resolved` without what may differ between daemons of one run: the paths
// of this machine's files (data_dir, initial_weights).
TrainingConfig WithoutLocalPaths(const TrainingConfig& resolved) {
  TrainingConfig copy = resolved;
  copy.clear_data_dir();
  copy.clear_initial_weights();
  return copy;
}

}  // namespace

uint64_t ConfigFingerprint(const TrainingConfig& resolved) {
  TrainingConfig copy = WithoutLocalPaths(resolved);
  // call_timeout_s is hashed under its old field number (sync_timeout_s,
  // proto/config.proto), so that a config fingerprints as it did in older
  // builds and their checkpoints still match.
  if (copy.has_call_timeout_s()) {
    copy.set_sync_timeout_s(copy.call_timeout_s());
    copy.clear_call_timeout_s();
  }
  std::string bytes;
  {
    google::protobuf::io::StringOutputStream stream(&bytes);
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.SetSerializationDeterministic(true);
    copy.SerializeToCodedStream(&coded);
  }
  // FNV-1a: stable across processes and builds, unlike absl::Hash.
  uint64_t hash = 14695981039346656037ull;
  for (unsigned char byte : bytes) {
    hash ^= byte;
    hash *= 1099511628211ull;
  }
  return hash;
}

namespace {

// `field` of `config` in text format on one line: a value, "[a, b]" for a
// repeated field, "(unset)" for an optional one not set.
std::string FieldText(const TrainingConfig& config,
                      const google::protobuf::FieldDescriptor* field) {
  const google::protobuf::Reflection* reflection = config.GetReflection();
  google::protobuf::TextFormat::Printer printer;
  printer.SetSingleLineMode(true);
  std::string value;
  if (!field->is_repeated()) {
    if (field->has_presence() && !reflection->HasField(config, field)) {
      return "(unset)";
    }
    printer.PrintFieldValueToString(config, field, -1, &value);
    return value;
  }
  std::vector<std::string> values;
  for (int i = 0; i < reflection->FieldSize(config, field); ++i) {
    printer.PrintFieldValueToString(config, field, i, &value);
    values.push_back(std::string(absl::StripAsciiWhitespace(value)));
  }
  return absl::StrCat("[", absl::StrJoin(values, ", "), "]");
}

}  // namespace

std::string ConfigDifferences(const TrainingConfig& theirs,
                              const TrainingConfig& mine, int max_fields) {
  // What ConfigFingerprint covers.
  const TrainingConfig left = WithoutLocalPaths(theirs);
  const TrainingConfig right = WithoutLocalPaths(mine);
  const google::protobuf::Descriptor* descriptor = TrainingConfig::descriptor();
  std::vector<std::string> lines;
  int more = 0;
  for (int i = 0; i < descriptor->field_count(); ++i) {
    const google::protobuf::FieldDescriptor* field = descriptor->field(i);
    const std::string a = FieldText(left, field);
    const std::string b = FieldText(right, field);
    if (a == b) continue;
    if (static_cast<int>(lines.size()) < max_fields) {
      lines.push_back(absl::StrCat(field->name(), ": ", a, " -> ", b));
    } else {
      ++more;
    }
  }
  if (more > 0) lines.push_back(absl::StrCat("... and ", more, " more"));
  return absl::StrJoin(lines, "\n");
}

std::string ModeName(Mode mode) {
  return absl::AsciiStrToLower(Mode_Name(mode));
}

std::string ModeNames() {
  const google::protobuf::EnumDescriptor* modes = Mode_descriptor();
  std::vector<std::string> names;
  for (int i = 0; i < modes->value_count(); ++i) {
    const Mode mode = static_cast<Mode>(modes->value(i)->number());
    if (mode != MODE_UNSPECIFIED) names.push_back(ModeName(mode));
  }
  return absl::StrJoin(names, ", ");
}

absl::StatusOr<Mode> ParseMode(absl::string_view name) {
  Mode mode;
  if (!Mode_Parse(absl::AsciiStrToUpper(name), &mode) ||
      mode == MODE_UNSPECIFIED) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown mode '", name, "'; use one of ", ModeNames()));
  }
  return mode;
}

absl::Status CheckScriptMode(Mode mode) {
  if (mode != ALLREDUCE) return absl::OkStatus();
  return absl::UnimplementedError(
      "mode allreduce is not open to scripts yet: only ps_worker's C++ "
      "models join the ring (for a PyTorch model's all-reduce, "
      "torch.nn.parallel.DistributedDataParallel is the tool)");
}

std::string OptimizerName(Optimizer optimizer) {
  if (optimizer == OPTIMIZER_AUTO) return "auto";
  return absl::AsciiStrToLower(Optimizer_Name(optimizer));
}

std::string ConfigToText(const TrainingConfig& config) {
  std::string text;
  google::protobuf::TextFormat::PrintToString(config, &text);
  return text;
}

absl::StatusOr<std::vector<int>> ParseIntList(absl::string_view text) {
  std::vector<int> values;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    int value;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(part), &value) ||
        value <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", part, "' in '", text,
                       "' is not a positive integer (expected e.g. 256,128)"));
    }
    values.push_back(value);
  }
  return values;
}

}  // namespace monsoon::common
