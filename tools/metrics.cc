#include "tools/metrics.h"

#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/config.h"
#include "common/model_layout.h"

namespace monsoon::tools {
namespace {

// JSON numbers: integers exactly, others with enough digits to round-trip
// what matters here.
std::string Number(double value) { return absl::StrFormat("%.6g", value); }

}  // namespace

std::string JsonQuoted(const std::string& text) {
  google::protobuf::Value value;
  value.set_string_value(text);
  std::string json;
  if (!google::protobuf::util::MessageToJsonString(value, &json).ok()) {
    return "\"\"";  // only for text that is not UTF-8
  }
  return json;
}

std::string MessageJson(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  std::string json;
  if (!google::protobuf::util::MessageToJsonString(message, &json, options)
           .ok()) {
    return "{}";  // only for a string field that is not UTF-8
  }
  return json;
}

std::string ConfigJson(const TrainingConfig& config) {
  TrainingConfig full = config;
  const google::protobuf::Reflection* reflection = full.GetReflection();
  const google::protobuf::Descriptor* descriptor = full.GetDescriptor();
  for (int i = 0; i < descriptor->field_count(); ++i) {
    const google::protobuf::FieldDescriptor* field = descriptor->field(i);
    if (field->is_repeated() || field->containing_oneof() != nullptr ||
        reflection->HasField(full, field)) {
      continue;
    }
    using google::protobuf::FieldDescriptor;
    switch (field->cpp_type()) {
      case FieldDescriptor::CPPTYPE_INT32:
        reflection->SetInt32(&full, field, field->default_value_int32());
        break;
      case FieldDescriptor::CPPTYPE_INT64:
        reflection->SetInt64(&full, field, field->default_value_int64());
        break;
      case FieldDescriptor::CPPTYPE_UINT32:
        reflection->SetUInt32(&full, field, field->default_value_uint32());
        break;
      case FieldDescriptor::CPPTYPE_UINT64:
        reflection->SetUInt64(&full, field, field->default_value_uint64());
        break;
      case FieldDescriptor::CPPTYPE_FLOAT:
        reflection->SetFloat(&full, field, field->default_value_float());
        break;
      case FieldDescriptor::CPPTYPE_DOUBLE:
        reflection->SetDouble(&full, field, field->default_value_double());
        break;
      case FieldDescriptor::CPPTYPE_BOOL:
        reflection->SetBool(&full, field, field->default_value_bool());
        break;
      case FieldDescriptor::CPPTYPE_ENUM:
        reflection->SetEnum(&full, field, field->default_value_enum());
        break;
      case FieldDescriptor::CPPTYPE_STRING:
        reflection->SetString(&full, field, field->default_value_string());
        break;
      case FieldDescriptor::CPPTYPE_MESSAGE:
        break;  // a message left out stays out
    }
  }
  return MessageJson(full);
}

std::vector<int64_t> MergeStalenessCounts(
    const std::vector<StatsResponse>& shards) {
  std::vector<int64_t> counts;
  for (const StatsResponse& shard : shards) {
    if (counts.size() < static_cast<size_t>(shard.staleness_counts_size())) {
      counts.resize(shard.staleness_counts_size(), 0);
    }
    for (int i = 0; i < shard.staleness_counts_size(); ++i) {
      counts[i] += shard.staleness_counts(i);
    }
  }
  return counts;
}

StalenessSummary SummarizeStaleness(const std::vector<StatsResponse>& shards) {
  const std::vector<int64_t> counts = MergeStalenessCounts(shards);
  StalenessSummary summary;
  for (const StatsResponse& shard : shards) {
    summary.max = std::max(summary.max, shard.staleness_max());
  }
  double sum = 0;
  for (size_t s = 0; s < counts.size(); ++s) {
    summary.pushes += counts[s];
    sum += static_cast<double>(s) * counts[s];
  }
  if (summary.pushes == 0) return summary;
  summary.mean = sum / summary.pushes;
  auto percentile = [&](double q) -> int64_t {
    // Nearest rank: the ceil(q * n)-th smallest value (1-based).
    const int64_t rank = std::max<int64_t>(
        1, static_cast<int64_t>(q * summary.pushes + 0.999999999));
    int64_t seen = 0;
    for (size_t s = 0; s < counts.size(); ++s) {
      seen += counts[s];
      if (seen >= rank) return static_cast<int64_t>(s);
    }
    return static_cast<int64_t>(counts.size()) - 1;
  };
  summary.p50 = percentile(0.50);
  summary.p99 = percentile(0.99);
  return summary;
}

void AddWorkerPhases(const WorkerReport& report, RunMetrics* run) {
  for (const PhaseTime& phase : report.phases()) {
    PhaseTotal& total = run->step_phases[phase.phase()];
    total.count += phase.count();
    total.seconds += phase.seconds();
  }
  run->ring_bytes_sent += report.ring_bytes_sent();
  run->ring_bytes_received += report.ring_bytes_received();
  run->shard_pushes_during_backward += report.shard_pushes_during_backward();
  run->updates_acknowledged += report.updates_acknowledged();
  run->updates_answered_as_duplicate += report.updates_answered_as_duplicate();
  run->updates_lost += report.updates_lost();
  run->examples_lost += report.examples_lost();
  run->max_step_gap_s = std::max(run->max_step_gap_s, report.max_step_gap_s());
}

std::string MetricsJson(const RunMetrics& run) {
  int64_t bytes_pushed = 0, bytes_pulled = 0, pushes = 0, rejected = 0,
          duplicates = 0, skipped = 0, backup_dropped = 0;
  for (const StatsResponse& shard : run.shard_stats) {
    bytes_pushed += shard.bytes_pushed();
    bytes_pulled += shard.bytes_pulled();
    rejected += shard.rejected_pushes();
    duplicates += shard.duplicate_pushes();
    backup_dropped += shard.backup_dropped_pushes();
  }
  if (!run.shard_stats.empty()) {
    // Every push reaches every shard: shard 0 counts each once.
    pushes = run.shard_stats[0].pushes();
    for (const auto& [rank, samples] :
         run.shard_stats[0].samples_skipped_by_worker()) {
      skipped += samples;
    }
  }
  const StalenessSummary staleness = SummarizeStaleness(run.shard_stats);
  double final_accuracy = 0, final_loss = 0;
  if (run.curve.points_size() > 0) {
    const EvalPoint& last = run.curve.points(run.curve.points_size() - 1);
    final_accuracy = last.test_accuracy();
    final_loss = last.test_loss();
  }
  const TrainingConfig& c = run.config;
  const common::ModelLayout layout = common::ModelLayout::FromConfig(c);
  std::string json = "{\n";
  absl::StrAppend(&json, "  \"mode\": \"", common::ModeName(c.mode()), "\",\n");
  absl::StrAppend(&json, "  \"servers\": ", run.servers, ",\n");
  absl::StrAppend(&json, "  \"workers\": ", run.workers, ",\n");
  absl::StrAppend(&json, "  \"wall_time_s\": ", Number(run.wall_time_s), ",\n");
  absl::StrAppend(&json, "  \"train_time_s\": ", Number(run.train_time_s),
                  ",\n");
  absl::StrAppend(&json, "  \"samples\": ", run.trained_samples, ",\n");
  absl::StrAppend(
      &json, "  \"samples_per_s\": ",
      Number(run.train_time_s > 0 ? run.trained_samples / run.train_time_s : 0),
      ",\n");
  absl::StrAppend(&json, "  \"final_test_accuracy\": ", Number(final_accuracy),
                  ",\n");
  absl::StrAppend(&json, "  \"final_test_loss\": ", Number(final_loss), ",\n");
  const bool click = c.model() == SPARSE_LR;
  if (click) {
    const double auc =
        run.curve.points_size() > 0
            ? run.curve.points(run.curve.points_size() - 1).test_auc()
            : 0;
    absl::StrAppend(&json, "  \"final_test_auc\": ", Number(auc), ",\n");
    absl::StrAppend(&json, "  \"final_test_logloss\": ", Number(final_loss),
                    ",\n");
  }
  absl::StrAppend(&json, "  \"bytes_pushed\": ", bytes_pushed, ",\n");
  absl::StrAppend(&json, "  \"bytes_pulled\": ", bytes_pulled, ",\n");
  // What crossed the network: pushes, pulls and the ring's segments (each
  // sent by one worker and received by its neighbour: counted once).
  absl::StrAppend(&json, "  \"ring_bytes_sent\": ", run.ring_bytes_sent,
                  ",\n");
  absl::StrAppend(&json, "  \"ring_bytes_received\": ",
                  run.ring_bytes_received, ",\n");
  absl::StrAppend(&json, "  \"bytes_total\": ",
                  bytes_pushed + bytes_pulled + run.ring_bytes_sent, ",\n");
  absl::StrAppend(&json, "  \"pushes\": ", pushes, ",\n");
  absl::StrAppend(&json, "  \"shard_pushes_during_backward\": ",
                  run.shard_pushes_during_backward, ",\n");
  absl::StrAppend(&json, "  \"rejected_pushes\": ", rejected, ",\n");
  absl::StrAppend(&json, "  \"duplicate_pushes\": ", duplicates, ",\n");
  absl::StrAppend(&json, "  \"samples_skipped\": ", skipped, ",\n");
  absl::StrAppend(&json, "  \"backup_dropped_pushes\": ", backup_dropped,
                  ",\n");
  absl::StrAppend(&json, "  \"stopped_by_time_limit\": ",
                  run.stopped_by_time_limit ? "true" : "false", ",\n");
  absl::StrAppend(&json, "  \"restarts\": ", run.restarts, ",\n");
  int64_t failovers = 0;
  for (const StatsResponse& shard : run.shard_stats) {
    failovers += shard.take_overs();
  }
  absl::StrAppend(&json, "  \"replicas\": ", run.replicas, ",\n");
  absl::StrAppend(&json, "  \"failovers\": ", failovers, ",\n");
  absl::StrAppend(&json, "  \"updates_acknowledged\": ",
                  run.updates_acknowledged, ",\n");
  absl::StrAppend(&json, "  \"updates_answered_as_duplicate\": ",
                  run.updates_answered_as_duplicate, ",\n");
  absl::StrAppend(&json, "  \"updates_lost\": ", run.updates_lost, ",\n");
  absl::StrAppend(&json, "  \"examples_lost\": ", run.examples_lost, ",\n");
  absl::StrAppend(&json, "  \"max_step_gap_s\": ", Number(run.max_step_gap_s),
                  ",\n");
  // Elastic runs, from shard 0 (which keeps the data queue): its membership
  // epoch (a join or a leave each), the examples its ledger applied twice,
  // and each epoch's examples trained (of its done data shards).
  const StatsResponse first =
      run.shard_stats.empty() ? StatsResponse() : run.shard_stats[0];
  absl::StrAppend(&json, "  \"elastic\": ",
                  run.config.elastic() ? "true" : "false", ",\n");
  absl::StrAppend(&json, "  \"membership_changes\": ",
                  first.membership_epoch(), ",\n");
  absl::StrAppend(&json, "  \"examples_trained_twice\": ",
                  first.data_queue().examples_trained_twice(), ",\n");
  absl::StrAppend(&json, "  \"data_shards_requeued\": ",
                  first.data_queue().shards_requeued(), ",\n");
  absl::StrAppend(&json, "  \"join_to_first_push_s\": ",
                  Number(run.join_to_first_push_s), ",\n");
  absl::StrAppend(&json, "  \"add_to_first_push_s\": ",
                  Number(run.add_to_first_push_s), ",\n");
  absl::StrAppend(&json, "  \"examples_trained\": [",
                  absl::StrJoin(first.data_queue().examples_trained(), ", "),
                  "],\n");
  json += "  \"events\": [";
  for (size_t i = 0; i < run.events.size(); ++i) {
    absl::StrAppend(&json, i == 0 ? "" : ", ",
                    "{\"time_s\": ", Number(run.events[i].time_s),
                    ", \"what\": ", JsonQuoted(run.events[i].what), "}");
  }
  json += "],\n";
  absl::StrAppend(&json, "  \"staleness\": {\"mean\": ", Number(staleness.mean),
                  ", \"p50\": ", staleness.p50, ", \"p99\": ", staleness.p99,
                  ", \"max\": ", staleness.max, "},\n");
  absl::StrAppend(&json, "  \"staleness_histogram\": [",
                  absl::StrJoin(MergeStalenessCounts(run.shard_stats), ", "),
                  "],\n");
  json += "  \"step_phases\": {";
  bool first_phase = true;
  for (const auto& [phase, total] : run.step_phases) {
    absl::StrAppend(
        &json, first_phase ? "" : ", ", JsonQuoted(phase),
        ": {\"seconds\": ", Number(total.seconds), ", \"count\": ", total.count,
        ", \"mean_ms\": ",
        Number(total.count > 0 ? 1000 * total.seconds / total.count : 0), "}");
    first_phase = false;
  }
  json += "},\n";
  if (!c.sparse_tables().empty()) {
    // Each table's rows, row updates and rows evicted, summed over the
    // shards (each row lives on one shard).
    json += "  \"sparse_tables\": {";
    for (int t = 0; t < c.sparse_tables_size(); ++t) {
      const std::string& name = c.sparse_tables(t).name();
      int64_t rows = 0, updates = 0, evicted = 0;
      for (const StatsResponse& shard : run.shard_stats) {
        const auto r = shard.sparse_rows().find(name);
        if (r != shard.sparse_rows().end()) rows += r->second;
        const auto u = shard.sparse_row_updates().find(name);
        if (u != shard.sparse_row_updates().end()) updates += u->second;
        const auto e = shard.sparse_rows_evicted().find(name);
        if (e != shard.sparse_rows_evicted().end()) evicted += e->second;
      }
      absl::StrAppend(&json, t == 0 ? "" : ", ", JsonQuoted(name),
                      ": {\"rows\": ", rows, ", \"row_updates\": ", updates,
                      ", \"rows_evicted\": ", evicted, "}");
    }
    json += "},\n";
    // Row pushes each range applied (its copies agree on the count): with
    // every push applied once, the workers' steps that touched the range.
    json += "  \"row_pushes\": [";
    for (size_t s = 0; s < run.shard_stats.size(); ++s) {
      absl::StrAppend(&json, s == 0 ? "" : ", ", run.shard_stats[s].row_pushes());
    }
    json += "],\n";
  }
  absl::StrAppend(
      &json, "  \"network\": {\"layers\": ", JsonQuoted(layout.Describe()),
      ", \"input_shape\": ", JsonQuoted(common::ShapeString(layout.input())),
      ", \"parameters\": ", layout.num_params(),
      ", \"forward_flops_per_example\": ", layout.ForwardFlops(), "},\n");
  absl::StrAppend(&json, "  \"config\": ", ConfigJson(c), ",\n");
  json += "  \"curve\": [";
  for (int i = 0; i < run.curve.points_size(); ++i) {
    const EvalPoint& p = run.curve.points(i);
    absl::StrAppend(&json, i == 0 ? "\n" : ",\n",
                    "    {\"time_s\": ", Number(p.time_s()),
                    ", \"samples\": ", p.samples(),
                    ", \"test_accuracy\": ", Number(p.test_accuracy()),
                    ", \"test_loss\": ", Number(p.test_loss()),
                    click ? absl::StrCat(", \"test_auc\": ",
                                         Number(p.test_auc()))
                          : "",
                    ", \"bytes_pushed\": ", p.bytes_pushed(),
                    ", \"bytes_pulled\": ", p.bytes_pulled(), "}");
  }
  json += run.curve.points_size() > 0 ? "\n  ]\n}\n" : "]\n}\n";
  return json;
}

}  // namespace monsoon::tools
