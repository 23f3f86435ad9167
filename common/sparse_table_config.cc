#include "common/sparse_table_config.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"

namespace monsoon::common {
namespace {

absl::Status Invalid(const SparseTableConfig& config, const std::string& what) {
  return absl::InvalidArgumentError(
      absl::StrCat("sparse table '", config.name(), "': ", what));
}

}  // namespace

absl::Status ValidateSparseTable(const SparseTableConfig& config) {
  const std::string& name = config.name();
  if (name.empty() || name.size() > 64 ||
      !std::all_of(name.begin(), name.end(), [](char c) {
        return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
      })) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sparse table name '", name,
        "': give 1 to 64 characters of a-z, 0-9 and _"));
  }
  if (config.dim() < 1 || config.dim() > kMaxSparseDim) {
    return Invalid(config, absl::StrCat("dim ", config.dim(),
                                        " is outside [1, ", kMaxSparseDim, "]"));
  }
  if (!SparseTableConfig::Optimizer_IsValid(config.optimizer())) {
    return Invalid(config, "unknown optimizer");
  }
  const float acc = config.adagrad_initial_accumulator();
  if (!(std::isfinite(acc) && acc > 0)) {
    return Invalid(config, absl::StrCat("adagrad_initial_accumulator ", acc,
                                        " must be finite and above 0"));
  }
  if (config.has_init_scale() &&
      !(std::isfinite(config.init_scale()) && config.init_scale() >= 0 &&
        config.init_scale() <= 1e3f)) {
    return Invalid(config, absl::StrCat("init_scale ", config.init_scale(),
                                        " is outside [0, 1000]"));
  }
  if (config.has_learning_rate() &&
      !(std::isfinite(config.learning_rate()) && config.learning_rate() > 0 &&
        config.learning_rate() <= 1e3f)) {
    return Invalid(config, absl::StrCat("learning_rate ",
                                        config.learning_rate(),
                                        " is outside (0, 1000]"));
  }
  if (config.admit_min_count() < 1 || config.admit_min_count() > 1000000) {
    return Invalid(config, absl::StrCat("admit_min_count ",
                                        config.admit_min_count(),
                                        " is outside [1, 1000000]"));
  }
  const float p = config.admit_probability();
  if (!(p > 0 && p <= 1)) {
    return Invalid(config, absl::StrCat("admit_probability ", p,
                                        " is outside (0, 1]"));
  }
  if (!config.has_max_rows()) {
    return Invalid(config,
                   "give max_rows, the most rows a shard holds of it (memory "
                   "is bounded by the config)");
  }
  if (config.max_rows() < 1 || config.max_rows() > kMaxSparseRows) {
    return Invalid(config, absl::StrCat("max_rows ", config.max_rows(),
                                        " is outside [1, ", kMaxSparseRows, "]"));
  }
  if (!SparseTableConfig::AtMaxRows_IsValid(config.at_max_rows())) {
    return Invalid(config, "unknown at_max_rows");
  }
  if (config.evict_unseen_steps() < 0) {
    return Invalid(config, absl::StrCat("evict_unseen_steps ",
                                        config.evict_unseen_steps(),
                                        " is negative (0: never)"));
  }
  return absl::OkStatus();
}

absl::Status ValidateSparseTables(
    const google::protobuf::RepeatedPtrField<SparseTableConfig>& tables,
    uint32_t buckets) {
  std::set<std::string> names;
  for (const SparseTableConfig& table : tables) {
    if (absl::Status valid = ValidateSparseTable(table); !valid.ok()) {
      return valid;
    }
    if (!names.insert(table.name()).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sparse_tables: two tables are named '", table.name(), "'"));
    }
  }
  if (buckets < 1 || buckets > kMaxSparseBuckets) {
    return absl::InvalidArgumentError(
        absl::StrCat("sparse_buckets ", buckets, " is outside [1, ",
                     kMaxSparseBuckets, "]"));
  }
  return absl::OkStatus();
}

}  // namespace monsoon::common
