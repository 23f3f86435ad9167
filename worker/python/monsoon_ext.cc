// _monsoon: the C++ side of the monsoon Python package, over pybind11. A
// PyTorch script's worker (ScriptWorker on a PsClient) and the run's layout
// file; monsoon/torch.py is the API scripts use. Tensors cross as
// float32 buffers (the buffer protocol: a CPU tensor's .numpy() view), so
// nothing here links against libtorch and one build works with any torch.
// The flags are ps_worker's (worker/client_flags.h and those below), read
// from MONSOON_<NAME> variables as the daemons read them, or set by
// configure(). Every call that waits on the network releases the GIL.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/config.h"
#include "common/daemon.h"
#include "common/flag_env.h"
#include "common/model_layout.h"
#include "common/process_tuning.h"
#include "common/termination.h"
#include "proto/metrics.pb.h"
#include "worker/client_flags.h"
#include "worker/evaluator.h"
#include "worker/ps_client.h"
#include "worker/script_worker.h"
#include "worker/training_loop.h"
#include "worker/worker_counters.h"

ABSL_FLAG(std::string, servers, "",
          "Comma-separated host:port of every shard, in shard order (env "
          "MONSOON_SERVERS).");
ABSL_FLAG(int, rank, 0, "This worker's rank, 0-based (env MONSOON_RANK).");
ABSL_FLAG(int, num_workers, 1,
          "Worker replicas in the run (env MONSOON_NUM_WORKERS).");
ABSL_FLAG(std::string, config, "",
          "The run's text-format TrainingConfig, with the model's `tensors` "
          "(env MONSOON_CONFIG).");
ABSL_FLAG(double, shard_lost_timeout_s, 300,
          "How long to wait for a lost shard to come back.");
ABSL_FLAG(std::string, report_out, "",
          "Where a worker writes its monsoon.WorkerReport (text format) when "
          "it finishes: steps, examples, where the steps' time went (env "
          "MONSOON_REPORT_OUT; the launchers set it).");
ABSL_FLAG(std::string, curve_out, "",
          "Where the evaluator writes its curve, a text-format "
          "monsoon.EvalCurve (env MONSOON_CURVE_OUT).");
ABSL_FLAG(double, interval_s, 2,
          "Seconds between the evaluator's evaluations (env "
          "MONSOON_INTERVAL_S).");

namespace monsoon::python {
namespace {

namespace py = pybind11;

// Raised for a Status that is not OK: "CODE: message".
class StatusError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

void Check(const absl::Status& status) {
  if (!status.ok()) throw StatusError(status.ToString());
}

template <typename T>
T Check(absl::StatusOr<T> value) {
  Check(value.status());
  return *std::move(value);
}

// A float32, C-contiguous buffer's values; ValueError otherwise.
absl::Span<float> FloatSpan(py::buffer buffer, const char* what) {
  py::buffer_info info = buffer.request(/*writable=*/true);
  if (info.format != py::format_descriptor<float>::format() ||
      info.itemsize != sizeof(float)) {
    throw py::value_error(absl::StrCat(
        what, " must be float32 (format 'f'), not format '", info.format,
        "': monsoon keeps the model's parameters as float32"));
  }
  py::ssize_t expected = sizeof(float);
  for (int d = info.ndim - 1; d >= 0; --d) {
    if (info.shape[d] > 1 && info.strides[d] != expected) {
      throw py::value_error(
          absl::StrCat(what, " must be contiguous (C order)"));
    }
    expected *= info.shape[d];
  }
  return absl::MakeSpan(static_cast<float*>(info.ptr),
                        static_cast<size_t>(info.size));
}

// A contiguous buffer of 64-bit integers (numpy or torch int64, or uint64)
// as sparse ids: an int64 id is its bit pattern (torch has no uint64).
absl::Span<const uint64_t> IdSpan(py::buffer buffer) {
  py::buffer_info info = buffer.request();
  const std::string& f = info.format;
  if (info.itemsize != sizeof(uint64_t) ||
      (f != "q" && f != "Q" && f != "l" && f != "L" && f != "<q" &&
       f != "<Q" && f != "<l" && f != "<L")) {
    throw py::value_error(absl::StrCat(
        "sparse ids must be 64-bit integers (int64 or uint64), not format '",
        f, "'"));
  }
  py::ssize_t expected = sizeof(uint64_t);
  for (int d = info.ndim - 1; d >= 0; --d) {
    if (info.shape[d] > 1 && info.strides[d] != expected) {
      throw py::value_error("sparse ids must be contiguous (C order)");
    }
    expected *= info.shape[d];
  }
  return absl::MakeConstSpan(static_cast<const uint64_t*>(info.ptr),
                             static_cast<size_t>(info.size));
}

// configure(): MONSOON_<NAME> variables, then `overrides` (flag name to
// value). Returns the MONSOON_ variables that name no flag.
std::vector<std::string> Configure(
    const std::vector<std::pair<std::string, std::string>>& overrides) {
  // This process is a Monsoon worker or evaluator from here on: its
  // tensors' memory is kept for the next step, as in the daemons.
  common::KeepFreedMemory();
  std::vector<std::string> unknown = Check(common::ApplyFlagEnvironment());
  for (const auto& [name, value] : overrides) {
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag == nullptr) {
      throw py::value_error(absl::StrCat("monsoon has no setting '", name,
                                         "'"));
    }
    std::string error;
    if (!flag->ParseFrom(value, &error)) {
      throw py::value_error(absl::StrCat("setting ", name, "=", value, ": ",
                                         error));
    }
  }
  return unknown;
}

std::string FlagValue(const std::string& name) {
  absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
  if (flag == nullptr) {
    throw py::value_error(absl::StrCat("monsoon has no setting '", name, "'"));
  }
  return flag->CurrentValue();
}

using Tensors = std::vector<std::pair<std::string, std::vector<int64_t>>>;

Tensors TensorsOf(const TrainingConfig& config) {
  Tensors tensors;
  for (const ExternalTensor& t : config.tensors()) {
    tensors.emplace_back(t.name(),
                         std::vector<int64_t>(t.dims().begin(), t.dims().end()));
  }
  return tensors;
}

// The resolved config at `path` ("" for --config), as a dict of what a
// script needs: mode, tensors, batch_size, the shards' and the local steps'
// rates.
py::dict ReadConfig(std::string path) {
  if (path.empty()) path = absl::GetFlag(FLAGS_config);
  TrainingConfig config = Check(common::LoadResolvedConfig(path));
  py::dict out;
  out["mode"] = common::ModeName(config.mode());
  out["tensors"] = TensorsOf(config);
  out["batch_size"] = config.batch_size();
  out["learning_rate"] = config.learning_rate();
  // The shards' rule (hogwild's is plain SGD whatever the optimizer says).
  out["optimizer"] = config.mode() == HOGWILD
                         ? std::string("sgd")
                         : common::OptimizerName(config.optimizer());
  out["momentum"] = config.mode() == HOGWILD ? 0.0f : config.momentum();
  out["weight_decay"] = config.weight_decay();
  out["lr_decay_epochs"] = config.lr_decay_epochs();
  out["lr_decay_factor"] = config.lr_decay_factor();
  out["local_learning_rate"] = config.local_learning_rate();
  out["local_momentum"] = config.local_momentum();
  py::dict tables;  // sparse table name -> dim
  for (const SparseTableConfig& table : config.sparse_tables()) {
    tables[py::str(table.name())] = table.dim();
  }
  out["sparse_tables"] = tables;
  out["epochs"] = config.epochs();
  out["seed"] = config.seed();
  out["elastic"] = config.elastic();
  return out;
}

// Writes a config (`base`, or every default) with `tensors` and
// initial_weights = `weights` to `out`, after checking it resolves.
void WriteLayout(const std::string& base, const Tensors& tensors,
                 const std::string& weights, const std::string& out) {
  TrainingConfig config;
  if (!base.empty()) config = Check(common::LoadConfigFile(base));
  config.clear_tensors();
  for (const auto& [name, dims] : tensors) {
    ExternalTensor* t = config.add_tensors();
    t->set_name(name);
    for (int64_t d : dims) t->add_dims(d);
  }
  config.set_initial_weights(weights);
  Check(common::ResolveConfig(config).status());
  std::ofstream file(out);
  file << common::ConfigToText(config);
  if (!file.flush()) {
    throw StatusError(absl::StrCat("cannot write the layout to ", out));
  }
}

// Writes `report` to --report_out, if set (the launchers read it as they
// read ps_worker's).
absl::Status WriteReportOut(const WorkerReport& report) {
  const std::string path = absl::GetFlag(FLAGS_report_out);
  if (path.empty()) return absl::OkStatus();
  return common::WriteFileAtomically(path, report.DebugString());
}

// The report of a worker that took no step: `outcome`.
void WriteReportOfNoSteps(const std::string& outcome) {
  Check(WriteReportOut(worker::MakeWorkerReport(
      absl::GetFlag(FLAGS_rank), 0, worker::WorkerResult(),
      worker::WorkerCounters(), outcome)));
}

// A script's worker: its client of the shards and the mode's steps.
class Worker {
 public:
  // `watch` (kept alive by the binding as long as this worker) ends its
  // waits on a signal: Python runs a signal's handler only between
  // bytecodes, so a call that waits for minutes (a lost shard ridden out,
  // an elastic worker waiting for data, connecting) would hold a launcher's
  // or Kubernetes' stop off until SIGKILL, and the report with it. The
  // watch reads the signals' numbers from Python's wakeup fd (see
  // monsoon/torch.py's _watch_signals).
  explicit Worker(const common::SignalPipeWatch* watch) : watch_(watch) {
    const TrainingConfig config =
        Check(common::LoadResolvedConfig(absl::GetFlag(FLAGS_config)));
    worker::PsClientOptions options;
    options.server_addresses = absl::StrSplit(absl::GetFlag(FLAGS_servers),
                                              ',', absl::SkipWhitespace());
    if (options.server_addresses.empty()) {
      throw py::value_error(
          "no servers: set MONSOON_SERVERS (host:port of every shard, in "
          "shard order) or pass servers= to monsoon.torch.init, or start the "
          "script with launch_local --worker_cmd");
    }
    options.config = config;
    options.worker_rank = absl::GetFlag(FLAGS_rank);
    options.num_workers = absl::GetFlag(FLAGS_num_workers);
    options.log_every = absl::Seconds(10);
    options.stop = &watch_->notified();
    int exit_code = 0;
    py::gil_scoped_release release;
    client_ = Check(worker::ConnectWithClientFlags(options, &exit_code));
    registered_ = absl::Now();
    resume_point_ = client_->applied_samples();
    worker_ = Check(worker::ScriptWorker::Create(
        client_.get(), config, options.worker_rank, options.num_workers,
        absl::Seconds(absl::GetFlag(FLAGS_shard_lost_timeout_s)),
        &watch_->notified()));
    mode_ = common::ModeName(config.mode());
    call_timeout_ = absl::Seconds(config.call_timeout_s());
  }

  // A sparse call that lost a shard waits for it as a step does.
  worker::PsClient::RideOut RideOut() {
    return [this](const absl::Status& lost) { return worker_->RideOut(lost); };
  }

  void Pull(py::buffer params) {
    absl::Span<float> p = FloatSpan(params, "params");
    py::gil_scoped_release release;
    Check(worker_->Pull(p));
  }
  // Rows of sparse table `table` for `ids` into `out` (float32, dim values
  // per id); repeats are asked once.
  void SparsePull(const std::string& table, py::buffer ids, py::buffer out) {
    absl::Span<const uint64_t> i = IdSpan(ids);
    absl::Span<float> o = FloatSpan(out, "out");
    py::gil_scoped_release release;
    Check(client_->SparsePull(table, i, o, call_timeout_, RideOut()));
  }
  // Row gradients of `ids` (float32, dim values per id), repeats summed.
  py::dict SparsePush(const std::string& table, py::buffer ids,
                      py::buffer grads) {
    absl::Span<const uint64_t> i = IdSpan(ids);
    absl::Span<float> g = FloatSpan(grads, "grads");
    SparsePushResponse response;
    {
      py::gil_scoped_release release;
      Check(client_->SparsePush(table, i, g, call_timeout_, &response,
                                RideOut()));
    }
    py::dict out;
    out["updated"] = response.updated();
    out["created"] = response.created();
    out["not_admitted"] = response.not_admitted();
    out["evicted"] = response.evicted();
    return out;
  }
  bool Step(py::buffer grads, int64_t samples, py::buffer params) {
    absl::Span<float> g = FloatSpan(grads, "grads");
    absl::Span<float> p = FloatSpan(params, "params");
    py::gil_scoped_release release;
    const absl::Time begin = absl::Now();
    // The script's time since the last step ended: its forward and
    // backward pass (and a local optimizer step), the "compute" phase.
    if (progress_.steps > 0) {
      Observe(worker::Phase::kCompute, begin - progress_.last_step);
    } else {
      progress_.first_step = begin;
    }
    absl::StatusOr<bool> replaced = worker_->Step(g, samples, p);
    if (!replaced.ok()) return Check(std::move(replaced));
    const absl::Time end = absl::Now();
    // The longest time between the ends of two steps (ps_worker counts the
    // first from its loop's start, which a script does not say).
    if (progress_.steps > 0) {
      progress_.max_step_gap =
          std::max(progress_.max_step_gap, end - progress_.last_step);
    } else {
      progress_.first_step_end = end;
    }
    progress_.last_step = end;
    Observe(worker_->StepReplacesParams() ? worker::Phase::kPushPull
                                          : worker::Phase::kPush,
            progress_.last_step - begin);
    ++progress_.steps;
    progress_.samples += samples;
    return *replaced;
  }
  // During backward (an autograd hook): grads[from, n) are final. False
  // where the mode does not push during backward.
  bool Ready(py::buffer grads, py::buffer params, int64_t samples,
             uint64_t from) {
    absl::Span<float> g = FloatSpan(grads, "grads");
    absl::Span<float> p = FloatSpan(params, "params");
    py::gil_scoped_release release;
    return Check(worker_->Ready(g, p, samples, from));
  }
  void Withdraw() { worker_->Withdraw(); }
  void AfterLocalStep(py::buffer params) {
    absl::Span<float> p = FloatSpan(params, "params");
    py::gil_scoped_release release;
    const absl::Time begin = absl::Now();
    absl::Status status = worker_->AfterLocalStep(p);
    // Downpour's fetch every n_fetch steps, easgd's exchange with the
    // centre (a pull, then the difference pushed): the step's exchange, in
    // the report as "pull", not in the next step's "compute".
    progress_.last_step = absl::Now();
    Observe(worker::Phase::kPull, progress_.last_step - begin);
    Check(std::move(status));
  }
  // Finishes the mode's steps and leaves the shards: `finished` counts the
  // rank as done (the run can end once every rank is). Writes the report
  // (--report_out) either way, with `outcome` ("" for "done") unless
  // something failed. After a signal (the watch's stop), what is still in
  // flight is given up and errors are the stop's echo: the report then says
  // `outcome` (or the signal), and Finish returns false.
  bool Finish(py::buffer params, bool finished, const std::string& outcome) {
    absl::Span<float> p = FloatSpan(params, "params");
    py::gil_scoped_release release;
    absl::Status done = worker_->Finish(p);
    counters_.shard_pushes_during_backward =
        worker_->counters().shard_pushes_during_backward.load();
    absl::Status left = client_->Leave(absl::Seconds(2), finished && done.ok());
    if (watch_->signal() != 0 && !(done.ok() && left.ok())) {
      Check(WriteReport(
          outcome.empty() ? absl::StrCat("stopped by signal ", watch_->signal())
                          : outcome));
      return false;
    }
    absl::Status reported = WriteReport(!done.ok()   ? done.ToString()
                                        : !left.ok() ? left.ToString()
                                        : outcome.empty() ? "done"
                                                          : outcome);
    Check(done);
    Check(left);
    Check(reported);
    return true;
  }

  // The next batch to train of a training set of `examples`
  // (ScriptWorker::NextBatch), as a dict: finished, or epoch, batch,
  // batches_per_epoch and rejoined.
  py::dict NextBatch(int64_t examples) {
    absl::StatusOr<worker::ScriptWorker::Batch> next;
    {
      py::gil_scoped_release release;
      next = worker_->NextBatch(examples);
    }
    Check(next.status());
    py::dict out;
    out["finished"] = next->finished;
    out["epoch"] = next->epoch;
    out["batch"] = next->batch;
    out["batches_per_epoch"] = next->batches_per_epoch;
    out["rejoined"] = next->rejoined;
    return out;
  }
  // `epoch`'s order of a training set of `examples` (int64 indices).
  py::array_t<int64_t> EpochOrder(int epoch, int64_t examples) const {
    if (examples < 0) throw py::value_error("examples must not be negative");
    std::vector<int64_t> order = worker_->EpochOrder(epoch, examples);
    py::array_t<int64_t> out(static_cast<py::ssize_t>(order.size()));
    std::copy(order.begin(), order.end(), out.mutable_data());
    return out;
  }
  int64_t data_shards() const { return worker_->data_shards(); }

  const std::string& mode() const { return mode_; }
  int64_t num_params() const { return worker_->num_params(); }
  bool step_replaces_params() const { return worker_->StepReplacesParams(); }
  int64_t steps() const { return worker_->steps(); }
  // The examples of this rank's data the shards had applied when it
  // connected: where a restarted script's data resumes.
  int64_t resume_point() const { return resume_point_; }
  int64_t pushes_withdrawn() const { return worker_->pushes_withdrawn(); }
  int64_t overlap_from() const { return worker_->OverlapFrom(); }
  int64_t shard_pushes_during_backward() const {
    return worker_->counters().shard_pushes_during_backward.load();
  }
  int64_t bytes_pushed() const { return client_->bytes_pushed(); }
  int64_t bytes_pulled() const { return client_->bytes_pulled(); }

 private:
  // The worker's report (WriteReportOut), with `outcome`.
  absl::Status WriteReport(const std::string& outcome) const {
    WorkerReport report = worker::MakeWorkerReport(
        absl::GetFlag(FLAGS_rank), 0, progress_, counters_, outcome);
    report.set_registered_unix_s(absl::ToUnixMicros(registered_) * 1e-6);
    return WriteReportOut(report);
  }

  void Observe(worker::Phase phase, absl::Duration time) {
    counters_.phases[static_cast<int>(phase)].Observe(
        absl::ToDoubleSeconds(time));
  }

  const common::SignalPipeWatch* const watch_;
  std::unique_ptr<worker::PsClient> client_;
  std::unique_ptr<worker::ScriptWorker> worker_;
  std::string mode_;
  absl::Duration call_timeout_;  // the config's call_timeout_s
  int64_t resume_point_ = 0;
  absl::Time registered_;  // when the client had registered with every shard
  worker::WorkerResult progress_;  // steps, examples, first and last step
  worker::WorkerCounters counters_;  // the phases' time
};

// The evaluator's client (rank -1): pulls the shards' current weights and
// their counters, and writes the curve (--curve_out) the C++ evaluator
// writes, with the script's accuracy and loss.
class Observer {
 public:
  Observer() : start_(absl::Now()) {
    const TrainingConfig config =
        Check(common::LoadResolvedConfig(absl::GetFlag(FLAGS_config)));
    int exit_code = 0;
    py::gil_scoped_release release;
    client_ = Check(worker::ConnectWithClientFlags(
        worker::ObserverOptions(absl::GetFlag(FLAGS_servers), config, nullptr),
        &exit_code));
    curve_.set_start_unix_s(absl::ToUnixMicros(start_) / 1e6);
    call_timeout_ = absl::Seconds(config.call_timeout_s());
  }

  // As Worker::SparsePull: the shards' rows, for an evaluation.
  void SparsePull(const std::string& table, py::buffer ids, py::buffer out) {
    absl::Span<const uint64_t> i = IdSpan(ids);
    absl::Span<float> o = FloatSpan(out, "out");
    py::gil_scoped_release release;
    Check(client_->SparsePull(table, i, o, call_timeout_));
  }

  // Pulls the weights into `params`; the point's time_s, samples, version
  // and bytes.
  py::dict Snapshot(py::buffer params) {
    absl::Span<float> p = FloatSpan(params, "params");
    EvalPoint point;
    {
      py::gil_scoped_release release;
      point = Check(worker::PullSnapshot(client_.get(), p, start_));
    }
    py::dict out;
    out["time_s"] = point.time_s();
    out["samples"] = point.samples();
    out["version"] = point.version();
    out["bytes_pushed"] = point.bytes_pushed();
    out["bytes_pulled"] = point.bytes_pulled();
    return out;
  }

  bool EveryWorkerFinished() {
    py::gil_scoped_release release;
    return worker::EveryWorkerFinished(*client_);
  }

  // Adds a point (Snapshot's, with test_accuracy and test_loss) to the
  // curve and writes it.
  void Record(const py::dict& point, bool run_finished) {
    EvalPoint* p = curve_.add_points();
    p->set_time_s(point["time_s"].cast<double>());
    p->set_samples(point["samples"].cast<int64_t>());
    p->set_version(point["version"].cast<int64_t>());
    p->set_bytes_pushed(point["bytes_pushed"].cast<int64_t>());
    p->set_bytes_pulled(point["bytes_pulled"].cast<int64_t>());
    p->set_test_accuracy(point["test_accuracy"].cast<double>());
    p->set_test_loss(point["test_loss"].cast<double>());
    curve_.set_run_finished(run_finished);
    const std::string path = absl::GetFlag(FLAGS_curve_out);
    if (!path.empty()) Check(worker::WriteCurve(path, curve_));
  }

 private:
  const absl::Time start_;
  std::unique_ptr<worker::PsClient> client_;
  absl::Duration call_timeout_;  // the config's call_timeout_s
  EvalCurve curve_;
};

}  // namespace
}  // namespace monsoon::python

PYBIND11_MODULE(_monsoon, m) {
  namespace py = pybind11;
  using monsoon::python::Configure;
  using monsoon::python::FlagValue;
  using monsoon::python::ReadConfig;
  using monsoon::python::StatusError;
  using monsoon::python::Worker;
  using monsoon::python::WriteLayout;
  m.doc() = "Monsoon's C++ worker for PyTorch scripts (use monsoon.torch)";
  py::register_exception<StatusError>(m, "Error", PyExc_RuntimeError);
  m.def("configure", &Configure, py::arg("overrides"));
  m.def("flag", &FlagValue, py::arg("name"));
  m.def("read_config", &ReadConfig, py::arg("path") = "");
  m.def("write_report_of_no_steps", &monsoon::python::WriteReportOfNoSteps,
        py::arg("outcome"));
  m.def("write_layout", &WriteLayout, py::arg("base"), py::arg("tensors"),
        py::arg("weights"), py::arg("out"));
  py::class_<monsoon::common::SignalPipeWatch>(m, "SignalWatch")
      .def(py::init<int, int, std::vector<int>>(), py::arg("read_fd"),
           py::arg("write_fd"), py::arg("signals"))
      .def_property_readonly("signal",
                             &monsoon::common::SignalPipeWatch::signal);
  py::class_<Worker>(m, "Worker")
      .def(py::init<const monsoon::common::SignalPipeWatch*>(),
           py::arg("watch"), py::keep_alive<1, 2>())
      .def("pull", &Worker::Pull, py::arg("params"))
      .def("step", &Worker::Step, py::arg("grads"), py::arg("samples"),
           py::arg("params"))
      .def("ready", &Worker::Ready, py::arg("grads"), py::arg("params"),
           py::arg("samples"), py::arg("from_value"))
      .def("withdraw", &Worker::Withdraw)
      .def("after_local_step", &Worker::AfterLocalStep, py::arg("params"))
      .def("next_batch", &Worker::NextBatch, py::arg("examples"))
      .def("epoch_order", &Worker::EpochOrder, py::arg("epoch"),
           py::arg("examples"))
      .def_property_readonly("data_shards", &Worker::data_shards)
      .def("sparse_pull", &Worker::SparsePull, py::arg("table"), py::arg("ids"),
           py::arg("out"))
      .def("sparse_push", &Worker::SparsePush, py::arg("table"), py::arg("ids"),
           py::arg("grads"))
      .def("finish", &Worker::Finish, py::arg("params"),
           py::arg("finished") = true, py::arg("outcome") = "")
      .def_property_readonly("mode", &Worker::mode)
      .def_property_readonly("num_params", &Worker::num_params)
      .def_property_readonly("step_replaces_params",
                             &Worker::step_replaces_params)
      .def_property_readonly("steps", &Worker::steps)
      .def_property_readonly("resume_point", &Worker::resume_point)
      .def_property_readonly("pushes_withdrawn", &Worker::pushes_withdrawn)
      .def_property_readonly("overlap_from", &Worker::overlap_from)
      .def_property_readonly("shard_pushes_during_backward",
                             &Worker::shard_pushes_during_backward)
      .def_property_readonly("bytes_pushed", &Worker::bytes_pushed)
      .def_property_readonly("bytes_pulled", &Worker::bytes_pulled);
  py::class_<monsoon::python::Observer>(m, "Observer")
      .def(py::init<>())
      .def("snapshot", &monsoon::python::Observer::Snapshot, py::arg("params"))
      .def("every_worker_finished",
           &monsoon::python::Observer::EveryWorkerFinished)
      .def("sparse_pull", &monsoon::python::Observer::SparsePull,
           py::arg("table"), py::arg("ids"), py::arg("out"))
      .def("record", &monsoon::python::Observer::Record, py::arg("point"),
           py::arg("run_finished"));
}
