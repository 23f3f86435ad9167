#include "worker/cuda_backend.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <limits>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "worker/cuda_kernels.h"

namespace monsoon::worker {
namespace {

// Pinned staging: a ring of slots, each used by one chunk of one copy and
// reused only after the event recorded behind that chunk has fired. Copies
// larger than a slot go through in slot-sized chunks, several in flight.
constexpr int kStagingSlots = 4;
constexpr size_t kStagingSlotBytes = size_t{2} << 20;

absl::StatusCode CodeFor(cudaError_t error) {
  switch (error) {
    case cudaErrorMemoryAllocation:
      return absl::StatusCode::kResourceExhausted;
    case cudaErrorInsufficientDriver:
    case cudaErrorNoDevice:
    case cudaErrorInvalidDevice:
    case cudaErrorDevicesUnavailable:
    case cudaErrorNoKernelImageForDevice:
    case cudaErrorUnsupportedPtxVersion:
    case cudaErrorSystemDriverMismatch:
    case cudaErrorCompatNotSupportedOnDevice:
      return absl::StatusCode::kFailedPrecondition;
    default:
      return absl::StatusCode::kInternal;
  }
}

absl::Status CudaStatus(absl::string_view call, cudaError_t error) {
  if (error == cudaSuccess) return absl::OkStatus();
  return absl::Status(CodeFor(error),
                      absl::StrCat(call, ": ", cudaGetErrorName(error), ": ",
                                   cudaGetErrorString(error)));
}

absl::Status CublasStatus(absl::string_view call, cublasStatus_t status) {
  if (status == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  absl::StatusCode code = absl::StatusCode::kInternal;
  if (status == CUBLAS_STATUS_ALLOC_FAILED) {
    code = absl::StatusCode::kResourceExhausted;
  } else if (status == CUBLAS_STATUS_INVALID_VALUE) {
    code = absl::StatusCode::kInvalidArgument;
  }
  return absl::Status(
      code, absl::StrCat(call, ": ", cublasGetStatusName(status), " (",
                         cublasGetStatusString(status), ")"));
}

class CudaBackend : public ComputeBackend {
 public:
  CudaBackend(int device, std::string name, int sm_count)
      : device_(device), name_(std::move(name)), sm_count_(sm_count) {}

  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  ~CudaBackend() override {
    cudaSetDevice(device_);
    if (stream_ != nullptr) cudaStreamSynchronize(stream_);
    if (cublas_ != nullptr) cublasDestroy(cublas_);
    for (Slot& slot : slots_) {
      if (slot.done != nullptr) cudaEventDestroy(slot.done);
    }
    if (staging_ != nullptr) cudaFreeHost(staging_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  // Makes the stream, the cuBLAS handle and the staging buffers.
  absl::Status Init() {
    if (auto s = CudaStatus("cudaSetDevice", cudaSetDevice(device_)); !s.ok()) {
      return s;
    }
    if (auto s = CudaStatus(
            "cudaStreamCreateWithFlags",
            cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
        !s.ok()) {
      return s;
    }
    if (auto s = CublasStatus("cublasCreate", cublasCreate(&cublas_));
        !s.ok()) {
      cublas_ = nullptr;
      return s;
    }
    if (auto s =
            CublasStatus("cublasSetStream", cublasSetStream(cublas_, stream_));
        !s.ok()) {
      return s;
    }
    // Plain float32 products and accumulation: no TF32 tensor-op math,
    // so that results match the CPU backend to float32 rounding.
    if (auto s = CublasStatus("cublasSetMathMode",
                              cublasSetMathMode(cublas_, CUBLAS_DEFAULT_MATH));
        !s.ok()) {
      return s;
    }
    void* staging = nullptr;
    if (auto s = CudaStatus(
            absl::StrCat("cudaHostAlloc(", kStagingSlots * kStagingSlotBytes,
                         " bytes of pinned staging)"),
            cudaHostAlloc(&staging, kStagingSlots * kStagingSlotBytes,
                          cudaHostAllocDefault));
        !s.ok()) {
      cudaGetLastError();
      return s;
    }
    staging_ = static_cast<char*>(staging);
    for (int i = 0; i < kStagingSlots; ++i) {
      slots_[i].host = staging_ + i * kStagingSlotBytes;
      if (auto s = CudaStatus("cudaEventCreateWithFlags",
                              cudaEventCreateWithFlags(&slots_[i].done,
                                                       cudaEventDisableTiming));
          !s.ok()) {
        return s;
      }
    }
    return absl::OkStatus();
  }

  std::string Name() const override { return name_; }

  absl::StatusOr<float*> AllocateFloats(size_t n) override {
    absl::StatusOr<void*> memory = Allocate(n, sizeof(float));
    if (!memory.ok()) return memory.status();
    return static_cast<float*>(*memory);
  }
  absl::StatusOr<int32_t*> AllocateInts(size_t n) override {
    absl::StatusOr<void*> memory = Allocate(n, sizeof(int32_t));
    if (!memory.ok()) return memory.status();
    return static_cast<int32_t*>(*memory);
  }
  absl::StatusOr<uint8_t*> AllocateBytes(size_t n) override {
    absl::StatusOr<void*> memory = Allocate(n, 1);
    if (!memory.ok()) return memory.status();
    return static_cast<uint8_t*>(*memory);
  }
  void Free(void* device) override {
    if (device == nullptr) return;
    Activate();
    Record(CudaStatus("cudaFree", cudaFree(device)));
  }

  absl::Status CopyToDevice(const void* host, void* device,
                            size_t bytes) override {
    Activate();
    const char* from = static_cast<const char*>(host);
    char* to = static_cast<char*>(device);
    for (size_t offset = 0; offset < bytes; offset += kStagingSlotBytes) {
      const size_t chunk = std::min(kStagingSlotBytes, bytes - offset);
      absl::StatusOr<Slot*> slot = NextSlot();
      if (!slot.ok()) return slot.status();
      std::memcpy((*slot)->host, from + offset, chunk);
      if (auto s = Check(
              CudaStatus("cudaMemcpyAsync (host to device)",
                         cudaMemcpyAsync(to + offset, (*slot)->host, chunk,
                                         cudaMemcpyHostToDevice, stream_)));
          !s.ok()) {
        return s;
      }
      if (auto s = MarkInUse(*slot); !s.ok()) return s;
    }
    return absl::OkStatus();
  }

  absl::Status CopyToHost(const void* device, void* host,
                          size_t bytes) override {
    Activate();
    absl::Status status = CopyToHostInChunks(device, host, bytes);
    if (!status.ok()) {
      // The caller's buffer may go away: deliver nothing more into it.
      for (Slot& slot : slots_) slot.deliver_to = nullptr;
    }
    return status;
  }

  void Gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha,
            const float* a, const float* b, float beta, float* c) override {
    if (m == 0 || n == 0) return;
    Activate();
    // cuBLAS is column-major, and a row-major matrix read column-major is
    // its transpose. So row-major C = op(A) op(B) is column-major
    // C^T = op(B)^T op(A)^T: pass B first, with each operand's own op, and
    // swap m and n. Leading dimensions are the stored row lengths.
    const int lda = std::max(1, trans_a ? m : k);
    const int ldb = std::max(1, trans_b ? k : n);
    Record(CublasStatus(
        "cublasSgemm",
        cublasSgemm(cublas_, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                    trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k, &alpha, b,
                    ldb, a, lda, &beta, c, std::max(1, n))));
  }

  void AddBias(int rows, int cols, const float* bias, float* y) override {
    Activate();
    Record(LaunchStatus(
        "AddBias", cuda::AddBias(stream_, sm_count_, rows, cols, bias, y)));
  }

  void Relu(size_t n, float* y) override {
    Activate();
    Record(LaunchStatus("Relu", cuda::Relu(stream_, sm_count_, n, y)));
  }

  void ReluBackward(size_t n, const float* y, float* dy) override {
    Activate();
    Record(LaunchStatus("ReluBackward",
                        cuda::ReluBackward(stream_, sm_count_, n, y, dy)));
  }

  void ColumnSums(int rows, int cols, const float* x, float* sums) override {
    Activate();
    Record(LaunchStatus("ColumnSums",
                        cuda::ColumnSums(stream_, rows, cols, x, sums)));
  }

  void SoftmaxCrossEntropy(int rows, int cols, const float* logits,
                           const int32_t* labels, float* dlogits,
                           float* stats) override {
    Activate();
    Record(LaunchStatus("SoftmaxCrossEntropy",
                        cuda::SoftmaxCrossEntropy(stream_, rows, cols, logits,
                                                  labels, dlogits, stats)));
  }

  void Im2Col(const WindowGeometry& g, int batch, const float* x,
              float* cols) override {
    Activate();
    Record(LaunchStatus("Im2Col", cuda::Im2Col(stream_, sm_count_, ToWindow(g),
                                               batch, x, cols)));
  }

  void Col2Im(const WindowGeometry& g, int batch, const float* cols,
              float* dx) override {
    Activate();
    Record(LaunchStatus("Col2Im", cuda::Col2Im(stream_, sm_count_, ToWindow(g),
                                               batch, cols, dx)));
  }

  void MaxPool(const WindowGeometry& g, int batch, const float* x, float* y,
               int32_t* argmax) override {
    Activate();
    Record(LaunchStatus(
        "MaxPool",
        cuda::MaxPool(stream_, sm_count_, ToWindow(g), batch, x, y, argmax)));
  }

  void MaxPoolBackward(const WindowGeometry& g, int batch, const float* dy,
                       const int32_t* argmax, float* dx) override {
    Activate();
    Record(LaunchStatus("MaxPoolBackward",
                        cuda::MaxPoolBackward(stream_, sm_count_, ToWindow(g),
                                              batch, dy, argmax, dx)));
  }

  void Axpy(size_t n, float alpha, const float* x, float* y) override {
    Activate();
    Record(
        LaunchStatus("Axpy", cuda::Axpy(stream_, sm_count_, n, alpha, x, y)));
  }

  void Scale(size_t n, float alpha, float* y) override {
    Activate();
    Record(LaunchStatus("Scale", cuda::Scale(stream_, sm_count_, n, alpha, y)));
  }

  void Fill(size_t n, float value, float* y) override {
    Activate();
    Record(LaunchStatus("Fill", cuda::Fill(stream_, sm_count_, n, value, y)));
  }

  absl::Status OneBitEncode(const float* grad, float* residual, size_t n,
                            int bucket_size, uint8_t* bits,
                            float* scales) override {
    if (bucket_size < 1) return BadBucketSize(bucket_size);
    Activate();
    return Check(LaunchStatus(
        "OneBitEncode", cuda::OneBitEncode(stream_, sm_count_, grad, residual,
                                           n, bucket_size, bits, scales)));
  }

  absl::Status OneBitDecode(const uint8_t* bits, const float* scales, size_t n,
                            int bucket_size, float* out) override {
    if (bucket_size < 1) return BadBucketSize(bucket_size);
    Activate();
    return Check(LaunchStatus(
        "OneBitDecode", cuda::OneBitDecode(stream_, sm_count_, bits, scales, n,
                                           bucket_size, out)));
  }

  absl::StatusOr<std::unique_ptr<CapturedWork>> CaptureWork(
      const std::function<void()>& work) override {
    Activate();
    if (auto s = Check(CudaStatus(
            "cudaStreamBeginCapture",
            cudaStreamBeginCapture(stream_, cudaStreamCaptureModeRelaxed)));
        !s.ok()) {
      return s;
    }
    work();
    cudaGraph_t graph = nullptr;
    absl::Status ended =
        CudaStatus("cudaStreamEndCapture", cudaStreamEndCapture(stream_, &graph));
    // An operation that failed during the recording left its error here.
    absl::Status first = std::move(first_error_);
    first_error_ = absl::OkStatus();
    if (first.ok()) first = ended;
    if (!first.ok()) {
      if (graph != nullptr) cudaGraphDestroy(graph);
      return first;
    }
    cudaGraphExec_t exec = nullptr;
    if (auto s = CudaStatus("cudaGraphInstantiate",
                            cudaGraphInstantiate(&exec, graph, 0));
        !s.ok()) {
      cudaGraphDestroy(graph);
      return s;
    }
    return std::unique_ptr<CapturedWork>(
        new CudaGraph(this, graph, exec));
  }

  absl::Status Synchronize() override {
    Activate();
    Record(CudaStatus("cudaStreamSynchronize", cudaStreamSynchronize(stream_)));
    absl::Status first = std::move(first_error_);
    first_error_ = absl::OkStatus();
    return first;
  }

 private:
  class CudaGraph : public CapturedWork {
   public:
    CudaGraph(CudaBackend* backend, cudaGraph_t graph, cudaGraphExec_t exec)
        : backend_(backend), graph_(graph), exec_(exec) {}
    ~CudaGraph() override {
      backend_->Activate();
      cudaGraphExecDestroy(exec_);
      cudaGraphDestroy(graph_);
    }
    absl::Status Replay() override {
      backend_->Activate();
      return backend_->Check(CudaStatus(
          "cudaGraphLaunch", cudaGraphLaunch(exec_, backend_->stream_)));
    }

   private:
    CudaBackend* backend_;
    cudaGraph_t graph_;
    cudaGraphExec_t exec_;
  };

  struct Slot {
    char* host = nullptr;        // kStagingSlotBytes of pinned memory
    cudaEvent_t done = nullptr;  // recorded behind the slot's last copy
    bool in_use = false;         // `done` not yet waited for
    char* deliver_to = nullptr;  // device-to-host: where the bytes go
    size_t deliver_bytes = 0;
  };

  static absl::Status BadBucketSize(int bucket_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("1-bit bucket size must be positive, got ", bucket_size));
  }

  // The calling thread may not be the one that made the backend.
  void Activate() {
    Record(CudaStatus("cudaSetDevice", cudaSetDevice(device_)));
  }

  // Keeps the first error for Synchronize.
  void Record(const absl::Status& status) {
    if (!status.ok() && first_error_.ok()) first_error_ = status;
  }
  // Records and returns `status`.
  absl::Status Check(absl::Status status) {
    Record(status);
    return status;
  }

  static cuda::Window ToWindow(const WindowGeometry& g) {
    return {g.height, g.width,   g.channels,   g.kernel,
            g.stride, g.padding, g.out_height, g.out_width};
  }

  static absl::Status LaunchStatus(absl::string_view kernel,
                                   cudaError_t error) {
    return CudaStatus(absl::StrCat(kernel, " kernel"), error);
  }

  absl::StatusOr<void*> Allocate(size_t n, size_t size) {
    if (n > std::numeric_limits<size_t>::max() / size) {
      return absl::ResourceExhaustedError(
          absl::StrCat("cannot allocate ", n, " values of ", size, " bytes"));
    }
    // A few bytes for n == 0, so that every allocation is a distinct pointer.
    const size_t bytes = std::max<size_t>(n * size, 256);
    Activate();
    void* memory = nullptr;
    const cudaError_t error = cudaMalloc(&memory, bytes);
    if (error != cudaSuccess) {
      // A failed cudaMalloc leaves its error for the next cudaGetLastError,
      // which would otherwise pin it on the next kernel launch.
      cudaGetLastError();
      return CudaStatus(
          absl::StrFormat("cudaMalloc(%d bytes) on %s", bytes, name_), error);
    }
    return memory;
  }

  absl::Status CopyToHostInChunks(const void* device, void* host,
                                  size_t bytes) {
    const char* from = static_cast<const char*>(device);
    char* to = static_cast<char*>(host);
    for (size_t offset = 0; offset < bytes; offset += kStagingSlotBytes) {
      const size_t chunk = std::min(kStagingSlotBytes, bytes - offset);
      // Waits for (and delivers) whatever the slot held: with several
      // chunks in flight, the oldest.
      absl::StatusOr<Slot*> slot = NextSlot();
      if (!slot.ok()) return slot.status();
      // Queued behind every earlier operation on the stream, so it sees
      // what they wrote.
      if (auto s = Check(
              CudaStatus("cudaMemcpyAsync (device to host)",
                         cudaMemcpyAsync((*slot)->host, from + offset, chunk,
                                         cudaMemcpyDeviceToHost, stream_)));
          !s.ok()) {
        return s;
      }
      if (auto s = MarkInUse(*slot); !s.ok()) return s;
      (*slot)->deliver_to = to + offset;
      (*slot)->deliver_bytes = chunk;
    }
    // Deliver the chunks still in flight.
    for (Slot& slot : slots_) {
      if (auto s = Retire(&slot); !s.ok()) return s;
    }
    return absl::OkStatus();
  }

  // The next staging slot, once its previous use is over.
  absl::StatusOr<Slot*> NextSlot() {
    Slot* slot = &slots_[next_slot_];
    next_slot_ = (next_slot_ + 1) % kStagingSlots;
    if (auto s = Retire(slot); !s.ok()) return s;
    return slot;
  }

  // Waits for the slot's last copy and delivers its bytes if it was one
  // to the host.
  absl::Status Retire(Slot* slot) {
    if (!slot->in_use) return absl::OkStatus();
    slot->in_use = false;
    char* deliver_to = std::exchange(slot->deliver_to, nullptr);
    if (auto s = Check(CudaStatus("cudaEventSynchronize (staging copy)",
                                  cudaEventSynchronize(slot->done)));
        !s.ok()) {
      return s;
    }
    if (deliver_to != nullptr) {
      std::memcpy(deliver_to, slot->host, slot->deliver_bytes);
    }
    return absl::OkStatus();
  }

  absl::Status MarkInUse(Slot* slot) {
    if (auto s = Check(CudaStatus("cudaEventRecord",
                                  cudaEventRecord(slot->done, stream_)));
        !s.ok()) {
      return s;
    }
    slot->in_use = true;
    return absl::OkStatus();
  }

  // Constant after construction.
  const int device_;
  const std::string name_;
  const int sm_count_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  char* staging_ = nullptr;

  // State below is touched by one thread at a time (see ComputeBackend).
  std::array<Slot, kStagingSlots> slots_;
  int next_slot_ = 0;
  absl::Status first_error_;
};

absl::Status NoUsableGpu(absl::string_view why) {
  return absl::FailedPreconditionError(absl::StrCat("no usable GPU: ", why));
}

}  // namespace

absl::StatusOr<std::unique_ptr<ComputeBackend>> MakeCudaBackend(int device) {
  int count = 0;
  cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    cudaGetLastError();
    return NoUsableGpu(CudaStatus("cudaGetDeviceCount", error).message());
  }
  if (count == 0) return NoUsableGpu("the CUDA runtime sees no device");
  if (device < 0 || device >= count) {
    return NoUsableGpu(absl::StrCat("there is no cuda:", device,
                                    "; this machine has ", count, " GPU",
                                    count == 1 ? "" : "s"));
  }
  if (error = cudaSetDevice(device); error != cudaSuccess) {
    cudaGetLastError();
    return NoUsableGpu(CudaStatus("cudaSetDevice", error).message());
  }
  cudaDeviceProp prop;
  if (error = cudaGetDeviceProperties(&prop, device); error != cudaSuccess) {
    cudaGetLastError();
    return NoUsableGpu(CudaStatus("cudaGetDeviceProperties", error).message());
  }
  const std::string name = absl::StrFormat(
      "cuda:%d (%s, sm_%d%d, %.1f GiB)", device, prop.name, prop.major,
      prop.minor, prop.totalGlobalMem / double{1 << 30});
  if (error = cuda::CheckKernelsLoad(); error != cudaSuccess) {
    cudaGetLastError();
    return NoUsableGpu(absl::StrCat(
        name,
        " cannot run this build's kernels (sm_90 code with compute_90 "
        "PTX): ",
        CudaStatus("cudaFuncGetAttributes", error).message()));
  }
  auto backend =
      std::make_unique<CudaBackend>(device, name, prop.multiProcessorCount);
  if (absl::Status s = backend->Init(); !s.ok()) {
    return absl::Status(
        s.code() == absl::StatusCode::kInternal
            ? absl::StatusCode::kResourceExhausted
            : s.code(),
        absl::StrCat("cannot set up ", name, ": ", s.message()));
  }
  return backend;
}

}  // namespace monsoon::worker
